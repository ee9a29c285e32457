"""Consumers: who a queue delivers to, and the channel interface it delivers through.

Responsibilities:
- ``Consumer``: tag, queue, ack mode, per-consumer prefetch and its count of unacked deliveries;
- ``DeliveryChannel``: what a queue needs of the channel behind a consumer (the server's channel
  implements it; tests can too); ``credit`` and ``deliver_many`` let a queue hand a consumer
  a batch of messages at once, ``deliver_encoded`` a batch of stored records as their encoded
  parts lie in storage (a stream's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, Protocol

from ..backends.base import Popped
from ..model import Message
from ..protocol.codec import FieldTable
from .arguments import ConsumerArguments

if TYPE_CHECKING:
    from .queue import Queue

log = logging.getLogger(__name__)

# What ``credit`` answers when nothing limits the deliveries.
UNLIMITED: Final = 1 << 30
# About this many body bytes at most go to a consumer in one batch (``deliver_many``,
# ``deliver_encoded``): the next batch asks for credit again, which a backed-up socket refuses.
DELIVER_BATCH_BYTES: Final = 1 << 20

# A delivery from its encoded parts: ``(message_id, names, properties, body)``, the names being
# the exchange and the routing key as two shortstrs, the properties as the content header
# carries them.
EncodedDelivery = tuple[int, bytes, bytes, bytes | memoryview]


class DeliveryChannel(Protocol):
    def deliver(
        self, consumer: Consumer, message_id: int, message: Message, redelivered: bool
    ) -> None:
        """Send one message to the consumer (never blocks)."""
        ...

    def credit(self) -> int:
        """How many deliveries the channel takes now: 0 while its socket is backed up, else
        what is left of its shared prefetch (``basic.qos`` global), else ``UNLIMITED``. A
        channel that goes from 0 to more tells the queues it consumes from
        (``Queue.channel_ready``)."""
        ...

    def deliver_many(self, consumer: Consumer, entries: list[Popped]) -> None:
        """``deliver`` each of ``entries`` (``message_id, message, redelivered``), in order,
        as one batch (never blocks)."""
        ...

    def deliver_encoded(self, consumer: Consumer, entries: list[EncodedDelivery]) -> None:
        """``deliver_many`` of messages given as their encoded parts (never redelivered)."""
        ...

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue went away: tell the client (``basic.cancel``) if it asked to be told."""
        ...


class Consumer:
    __slots__ = (
        "arguments",
        "channel",
        "exclusive",
        "no_ack",
        "prefetch_count",
        "priority",
        "queue",
        "tag",
        "timeout_ms",
        "unacked",
    )

    def __init__(
        self,
        tag: str,
        queue: Queue,
        channel: DeliveryChannel,
        *,
        no_ack: bool,
        exclusive: bool,
        prefetch_count: int,
        arguments: FieldTable,
    ) -> None:
        self.tag = tag
        self.queue = queue
        self.channel = channel
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch_count = prefetch_count  # 0 = unlimited
        self.arguments = arguments
        # RabbitMQ's consumer priority (higher first) and x-consumer-timeout (ms; overrides
        # the queue's and the broker's), checked by ``arguments.check_consumer_arguments``.
        parsed = ConsumerArguments.parse(arguments)
        self.priority = parsed.priority
        self.timeout_ms = parsed.timeout_ms
        self.unacked = 0

    def prefetch_full(self) -> bool:
        """Its own prefetch (``basic.qos`` global=false) is used up: it takes nothing until one
        of its messages is settled (whatever its channel takes)."""
        return not self.no_ack and 0 < self.prefetch_count <= self.unacked

    def credit(self) -> int:
        """How many deliveries it takes now: what is left of its prefetch (or ``UNLIMITED``),
        at most what its channel takes (``DeliveryChannel.credit``)."""
        channel = self.channel.credit()
        if self.no_ack or not self.prefetch_count:
            return channel
        left = self.prefetch_count - self.unacked
        return left if left < channel else channel

    def __repr__(self) -> str:
        return f"Consumer({self.tag!r} on {self.queue.name!r})"
