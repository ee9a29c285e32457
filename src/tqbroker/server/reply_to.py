"""Direct reply-to on one channel (RabbitMQ's ``amq.rabbitmq.reply-to`` pseudo-queue).

Responsibilities:
- the consumer on the pseudo-queue (no-ack only, one per channel) and the reply address the
  vhost hands out for it (registered on first consume, unregistered when the channel closes);
- a publish whose ``reply_to`` names the pseudo-queue carries that address instead;
- replies published to the address are delivered to the consumer (``deliver_reply``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..broker.vhost import VirtualHost
from ..model import Message
from ..protocol.errors import AMQPError, ReplyCode

log = logging.getLogger(__name__)


class ReplyTo:
    """One channel's direct reply-to consumer (the vhost's ``ReplyConsumer``)."""

    def __init__(self, vhost: VirtualHost, deliver: Callable[[str, Message], None]) -> None:
        self._vhost = vhost
        self._deliver = deliver  # (consumer tag, message): a no-ack delivery on the channel
        self.tag: str | None = None  # the consumer tag on the pseudo-queue
        self.address: str | None = None  # our reply-to address, once consumed

    def check_consume(self, no_ack: bool) -> None:
        """Check that ``basic.consume`` on the pseudo-queue may start (before consume-ok)."""
        if not no_ack:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.tag is not None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "reply consumer already set")

    def started(self, tag: str) -> None:
        """Consume-ok went out: start consuming (registering the address the first time)."""
        self.tag = tag
        if self.address is None:
            self.address = self._vhost.register_reply_consumer(self)

    def cancel(self, tag: str) -> bool:
        """``basic.cancel`` of ``tag``: True if it was the reply consumer's."""
        if tag != self.tag:
            return False
        self.tag = None
        return True

    def reply_address(self) -> str:
        """The address a publish's ``reply_to`` of the pseudo-queue is replaced with."""
        if self.tag is None or self.address is None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "fast reply consumer does not exist")
        return self.address

    def deliver_reply(self, message: Message) -> None:
        """Deliver a reply sent to our address (no ack expected)."""
        if self.tag is not None:
            self._deliver(self.tag, message)

    def close(self) -> None:
        self.tag = None
        if self.address is not None:
            self._vhost.unregister_reply_consumer(self.address)
        # The channel's bound method made a reference cycle (channel -> self -> channel).
        self._deliver = _closed


def _closed(tag: str, message: Message) -> None:
    """A closed channel's reply-to delivers nothing (``tag`` is None by then anyway)."""
