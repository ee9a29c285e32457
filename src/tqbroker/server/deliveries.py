"""A channel's deliveries awaiting acknowledgement.

Responsibilities:
- delivery tags (one sequence per channel, consumers' deliveries and ``basic.get`` alike);
- the unacked deliveries (``Delivery``), taken by ``basic.ack`` / ``nack`` / ``reject`` (``take``)
  and settled (``Settlement``: ack, requeue, or reject, which dead-letters or drops); an ack
  counts in its queue's ``ack`` counter;
- the delivery-acknowledgement timeout: when the oldest unacked delivery is due
  (``ack_deadline``), and the connection's task that closes a channel with 406 when it passes
  (``AckTimeouts``).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs
import trio

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
        return _REQUEUE if requeue else _REJECT


# The members as module globals: an enum member's class attribute costs ~70 ns to look up on
# Python 3.11, and settling is per delivery.
_ACK, _REQUEUE = Settlement.ACK, Settlement.REQUEUE
_REJECT = Settlement.REJECT


@attrs.define(slots=True, eq=False)
class Delivery:
    """One delivery waiting for its acknowledgement."""

    queue: Queue
    message_id: int
    consumer: Consumer | None  # None for basic.get
    delivered_at: float  # Trio time

    def settle(self, settlement: Settlement) -> None:
        if settlement is _ACK:
            self.queue.stats.ack += 1
            self.queue.ack(self.message_id, self.consumer)
        elif settlement is _REQUEUE:
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

    def track_many(
        self, first_tag: int, consumer: Consumer, message_ids: Iterable[int], now: float
    ) -> None:
        """``track`` a batch of deliveries to ``consumer`` at ``now``, with the tags from
        ``first_tag`` on."""
        unacked = self.unacked
        queue = consumer.queue
        tag = first_tag
        for message_id in message_ids:
            delivery = Delivery(queue, message_id, consumer, now)
            if unacked:
                unacked[tag] = delivery
            else:
                self.track(tag, delivery)
            tag += 1

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


def settle(taken: Iterable[tuple[int, Delivery]], settlement: Settlement) -> None:
    """Settle deliveries alike. Acks go to their queues in runs (``Queue.ack_many``: the
    deliveries of a ``multiple`` ack are most often one consumer's, of one queue), in tag
    order."""
    if settlement is _ACK:
        queue: Queue | None = None
        consumer: Consumer | None = None
        run: list[int] = []
        for _tag, delivery in taken:
            if delivery.queue is not queue or delivery.consumer is not consumer:
                if queue is not None:
                    _ack_run(queue, consumer, run)
                queue, consumer, run = delivery.queue, delivery.consumer, []
            run.append(delivery.message_id)
        if queue is not None:
            _ack_run(queue, consumer, run)
    else:
        for _tag, delivery in taken:
            delivery.settle(settlement)


def _ack_run(queue: Queue, consumer: Consumer | None, message_ids: list[int]) -> None:
    queue.stats.ack += len(message_ids)
    queue.ack_many(message_ids, consumer)


class AckTimeouts:
    """One connection's delivery-acknowledgement timeout task (``run``): close, with 406, a
    channel whose oldest unacked delivery is older than its consumer timeout
    (``x-consumer-timeout`` of the consumer, else of the queue, else the broker's
    ``consumer_timeout_ms``: RabbitMQ's 30 minutes by default); closing the channel requeues
    its deliveries. ``channels``: each open channel's number and deliveries."""

    def __init__(
        self,
        peer: str,
        channels: Callable[[], list[tuple[int, Deliveries]]],
        fail_channel: Callable[[AMQPError], None],
    ) -> None:
        self._peer = peer
        self._channels = channels
        self._fail_channel = fail_channel
        self._watch = trio.Event()  # set when an ack deadline earlier than the armed one came
        self._armed = math.inf  # the deadline the task sleeps until

    def watch(self, deadline: float) -> None:
        """A channel's oldest unacked delivery is due at ``deadline`` (Trio time): wake the
        task if that is earlier than what it sleeps until (rarely: deliveries come in order, so
        a later one is almost always due later)."""
        if deadline < self._armed:
            self._armed = deadline
            self._watch.set()

    async def run(self) -> None:
        while True:
            deadline = math.inf
            for _number, deliveries in self._channels():
                due = deliveries.ack_deadline()
                if due is not None:
                    deadline = min(deadline, due[0])
            self._armed = deadline
            with trio.move_on_at(deadline):
                await self._watch.wait()
            self._watch = trio.Event()
            now = trio.current_time()
            for number, deliveries in self._channels():
                due = deliveries.ack_deadline()
                if due is not None and due[0] <= now:
                    log.warning(
                        "consumer ack timed out on channel %d of %s (%d ms)",
                        number,
                        self._peer,
                        due[1],
                    )
                    self._fail_channel(
                        AMQPError(
                            ReplyCode.PRECONDITION_FAILED,
                            f"delivery acknowledgement on channel {number} timed out. "
                            f"Timeout value used: {due[1]} ms. This timeout value can be "
                            "configured, see consumers doc guide to learn more",
                            channel=number,
                        )
                    )
