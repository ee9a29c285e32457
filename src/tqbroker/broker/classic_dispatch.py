"""The delivery pass of a classic queue (``Dispatcher.dispatch``), run by its actor on every
wake-up: ready messages go to consumers with prefetch credit.

- A queue with one consumer to ask (the commonest case, and every queue of a fanout with a
  consumer each; with ``x-single-active-consumer``, the active one) hands it a batch: as many
  messages as its ``credit`` allows, at most ``DELIVER_BATCH`` (or about
  ``DELIVER_BATCH_BYTES``), in one ``DeliveryChannel.deliver_many``, so that asking for
  capacity, the channel's counters and tags and the writer's wake-up cost once per batch.
- Otherwise message by message: consumers by priority (``x-priority``, highest first), round-
  robin among equals, skipping those without credit.

The queue owns its ``Dispatcher`` and passes itself to each pass (``DeliverySource``: what a
pass reads and calls of it), so the dispatcher holds no reference back to its queue.
"""

from __future__ import annotations

import logging
import time
from typing import Final, Protocol

from ..backends.base import FLUSH_FIRST, FlushFirst, Popped, QueueStore
from .consumer import DELIVER_BATCH_BYTES, Consumer

log = logging.getLogger(__name__)

# Messages a queue expires (or skips as expired) in one go before letting other tasks run.
EXPIRE_BATCH: Final = 1000
# At most this many messages go to a consumer in one batch (or about DELIVER_BATCH_BYTES).
DELIVER_BATCH: Final = 1000


class DeliverySource(Protocol):
    """What a delivery pass needs of its queue (``ClassicQueue``)."""

    @property
    def name(self) -> str: ...

    @property
    def vhost(self) -> str: ...

    @property
    def store(self) -> QueueStore:
        """Read for ``ready_count``: messages waiting."""
        ...

    @property
    def consumers(self) -> list[Consumer]:
        """By priority, highest first."""
        ...

    @property
    def single_active_consumer(self) -> bool: ...

    def take(self, expire_at_most: float) -> Popped | FlushFirst | None:
        """Pop the next live message for delivery (``ClassicQueue.take``)."""
        ...

    def settle(self, message_id: int) -> None:
        """Remove a message for good (delivered to a ``no_ack`` consumer)."""
        ...

    def wake_after_flush(self) -> None:
        """The store must flush before it hands out more: run the pass again after it."""
        ...


class Dispatcher:
    """One classic queue's delivery pass, and what it remembers between passes."""

    __slots__ = ("_next_consumer", "dispatched_at")

    def __init__(self) -> None:
        self._next_consumer: dict[int, int] = {}  # round-robin position per consumer priority
        # The last pass (perf_counter_ns; never, at first): ``ClassicQueue.publish`` reads it.
        self.dispatched_at = -(2**63)

    def dispatch(self, queue: DeliverySource) -> None:
        self.dispatched_at = time.perf_counter_ns()
        store = queue.store
        consumers = queue.consumers
        while consumers and store.ready_count:
            if len(consumers) == 1 or queue.single_active_consumer:  # one consumer to ask
                if not self._deliver_batch(queue, consumers[0]):
                    return
                continue
            consumer = self._pick_consumer(queue)
            if consumer is None:
                return
            try:
                entry = queue.take(EXPIRE_BATCH)
            except OSError as exc:  # storage trouble: deliver again on the next wake-up
                log.error(
                    "queue %r in vhost %r: cannot read a message: %s", queue.name, queue.vhost, exc
                )
                return
            if entry is None:
                return
            if entry is FLUSH_FIRST:
                queue.wake_after_flush()
                return
            message_id, message, redelivered = entry
            if consumer.no_ack:
                queue.settle(message_id)
            else:
                consumer.unacked += 1
            consumer.channel.deliver(consumer, message_id, message, redelivered)

    def _deliver_batch(self, queue: DeliverySource, consumer: Consumer) -> bool:
        """Deliver to ``consumer`` as many messages as it takes now (``Consumer.credit``, at
        most ``DELIVER_BATCH`` or about ``DELIVER_BATCH_BYTES``) in one ``deliver_many``: the
        per-message work of the round-robin pass (asking for capacity, the channel's counters
        and tag, waking the writer) paid once per batch. False: the pass ends here (no credit,
        no live message, the store must flush first, storage trouble)."""
        credit = consumer.credit()
        if credit <= 0:
            return False
        credit = min(credit, DELIVER_BATCH)
        batch: list[Popped] = []
        size = 0
        go_on = True
        take = queue.take
        try:
            while len(batch) < credit and size < DELIVER_BATCH_BYTES:
                entry = take(EXPIRE_BATCH)
                if entry is None:
                    go_on = False
                    break
                if entry is FLUSH_FIRST:
                    queue.wake_after_flush()
                    go_on = False
                    break
                batch.append(entry)
                size += len(entry[1].body)
        except OSError as exc:  # storage trouble: deliver again on the next wake-up
            log.error(
                "queue %r in vhost %r: cannot read a message: %s", queue.name, queue.vhost, exc
            )
            go_on = False
        if batch:
            if consumer.no_ack:
                settle = queue.settle
                for entry in batch:
                    settle(entry[0])
            else:
                consumer.unacked += len(batch)
            consumer.channel.deliver_many(consumer, batch)
        return go_on

    def _pick_consumer(self, queue: DeliverySource) -> Consumer | None:
        """The consumer for the next message. With ``x-single-active-consumer`` only the
        earliest registered consumer receives. Otherwise consumers are tried by priority
        (``x-priority``, highest first; the list is kept in that order) and round-robin among
        equals, skipping those without prefetch credit."""
        consumers = queue.consumers
        n = len(consumers)
        if n == 1 or queue.single_active_consumer:  # one to ask (the commonest case)
            active = consumers[0]
            return active if active.has_capacity() else None
        group_start = 0
        while group_start < n:
            priority = consumers[group_start].priority
            group_end = group_start
            while group_end < n and consumers[group_end].priority == priority:
                group_end += 1
            size = group_end - group_start
            start = self._next_consumer.get(priority, 0)
            for i in range(size):
                index = group_start + (start + i) % size
                consumer = consumers[index]
                if consumer.has_capacity():
                    self._next_consumer[priority] = (start + i + 1) % size
                    return consumer
            group_start = group_end
        return None
