"""A channel's deliveries awaiting acknowledgement.

Responsibilities:
- delivery tags (one sequence per channel, consumers' deliveries and ``basic.get`` alike);
- the unacked deliveries (``Delivery``), taken by ``basic.ack`` / ``nack`` / ``reject`` (``take``)
  and settled (``Settlement``: ack, requeue, or reject, which dead-letters or drops);
- the delivery-acknowledgement timeout: when the oldest unacked delivery is due
  (``ack_deadline``); the connection closes the channel with 406 when it passes.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from typing import Protocol

import attrs

from ..broker.consumer import Consumer
from ..broker.queue import Queue
from ..protocol.errors import AMQPError, ReplyCode

log = logging.getLogger(__name__)


class Settlement(enum.Enum):
    """What becomes of a delivery its client settled."""

    ACK = "ack"
    REQUEUE = "requeue"  # back to the queue, redelivered
    REJECT = "reject"  # dead-lettered, or dropped

    @staticmethod
    def refused(requeue: bool) -> Settlement:
        """``basic.nack`` / ``basic.reject`` with their ``requeue`` flag."""
        return Settlement.REQUEUE if requeue else Settlement.REJECT


@attrs.define(slots=True, eq=False)
class Delivery:
    """One delivery waiting for its acknowledgement."""

    queue: Queue
    message_id: int
    consumer: Consumer | None  # None for basic.get
    delivered_at: float  # Trio time

    def settle(self, settlement: Settlement) -> None:
        if settlement is Settlement.ACK:
            self.queue.ack(self.message_id, self.consumer)
        elif settlement is Settlement.REQUEUE:
            self.queue.requeue(self.message_id, self.consumer)
        else:
            self.queue.reject(self.message_id, self.consumer)


class AckDeadlines(Protocol):
    """Where the acknowledgement timeout comes from and who watches it (the connection)."""

    @property
    def consumer_timeout_ms(self) -> int | None:
        """The broker's default (None: never)."""
        ...

    def watch_ack_deadline(self, deadline: float) -> None:
        """A channel's oldest unacked delivery is due at ``deadline`` (Trio time)."""
        ...


Taken = list[tuple[int, Delivery]]


class Deliveries:
    """The delivery tags of one channel and its deliveries not yet acknowledged, in tag order."""

    def __init__(self, deadlines: AckDeadlines) -> None:
        self._deadlines = deadlines
        self.unacked: dict[int, Delivery] = {}
        self.next_tag = 1

    def __len__(self) -> int:
        return len(self.unacked)

    def track(self, tag: int, delivery: Delivery) -> None:
        if not self.unacked:  # a new oldest delivery: its deadline may be the connection's next
            timeout = self.timeout_ms(delivery)
            if timeout is not None:
                self._deadlines.watch_ack_deadline(delivery.delivered_at + timeout / 1000)
        self.unacked[tag] = delivery

    def take(self, tag: int, multiple: bool) -> Taken:
        """Remove and return the deliveries an ack/nack/reject refers to."""
        unacked = self.unacked
        if multiple and tag == 0:
            return self.take_all()
        if tag not in unacked:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        if not multiple:
            return [(tag, unacked.pop(tag))]
        taken = []
        for t in unacked:
            if t > tag:
                break
            taken.append((t, unacked[t]))
        for t, _ in taken:
            del unacked[t]
        return taken

    def take_all(self) -> Taken:
        taken = list(self.unacked.items())
        self.unacked.clear()
        return taken

    def restore(self, taken: Iterable[tuple[int, Delivery]]) -> None:
        """Deliveries whose settlement was rolled back are unacknowledged again."""
        self.unacked.update(taken)
        self.unacked = dict(sorted(self.unacked.items()))
        self._deadlines.watch_ack_deadline(float("-inf"))  # recompute: the oldest may be back

    def timeout_ms(self, delivery: Delivery) -> int | None:
        """The delivery-acknowledgement timeout: the consumer's ``x-consumer-timeout``
        argument, else the queue's, else the broker's (None: never), as in RabbitMQ."""
        consumer = delivery.consumer
        if consumer is not None and consumer.timeout_ms is not None:
            return consumer.timeout_ms
        if delivery.queue.consumer_timeout_ms is not None:
            return delivery.queue.consumer_timeout_ms
        return self._deadlines.consumer_timeout_ms

    def ack_deadline(self) -> tuple[float, int] | None:
        """When the oldest unacked delivery times out (Trio time) and the timeout used (ms).
        Only the oldest is watched, as RabbitMQ does: a younger delivery with a shorter
        timeout waits for it."""
        for delivery in self.unacked.values():
            timeout = self.timeout_ms(delivery)
            return None if timeout is None else (delivery.delivered_at + timeout / 1000, timeout)
        return None


def requeue(taken: Iterable[tuple[int, Delivery]]) -> None:
    for _tag, delivery in taken:
        delivery.queue.requeue(delivery.message_id, delivery.consumer)
