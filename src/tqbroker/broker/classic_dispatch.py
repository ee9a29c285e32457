"""The delivery pass of a classic queue (``Dispatcher.dispatch``), run by its actor on every
wake-up: ready messages go to consumers with prefetch credit.

- A queue with one consumer to ask (the commonest case, and every queue of a fanout with a
  consumer each; with ``x-single-active-consumer``, the active one: the roster's first) hands it
  a batch: as many messages as its ``credit`` allows, at most ``DELIVER_BATCH`` (or about
  ``DELIVER_BATCH_BYTES``), in one ``DeliveryChannel.deliver_many``, so that asking for
  capacity, the channel's counters and tags and the writer's wake-up cost once per batch.
- Otherwise message by message, each to the consumer whose turn it is in the queue's
  ``ConsumerRing`` (``x-priority`` highest first, round robin among equals, only consumers that
  can take a message): O(log n) a message, however many consumers the queue has.

A pass gives way to other tasks once it has run for a slice (``pacing.Slice``): it wakes its
queue again and returns, and the actor goes on after a checkpoint.

The queue owns its ``Dispatcher`` and passes itself to each pass (``DeliverySource``: what a
pass reads and calls of it), so the dispatcher holds no reference back to its queue.
"""

from __future__ import annotations

import logging
import time
from typing import Final, Protocol

from ..backends.base import FLUSH_FIRST, FlushFirst, Popped, QueueStore
from .consumer import DELIVER_BATCH_BYTES, Consumer
from .consumer_ring import ConsumerRing
from .consumer_roster import ConsumerRoster
from .pacing import Slice

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
    def consumers(self) -> ConsumerRoster: ...

    @property
    def candidates(self) -> ConsumerRing:
        """The consumers in delivery order."""
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

    def wake(self) -> None:
        """Run the pass again, after other tasks had their turn."""
        ...


class Dispatcher:
    """One classic queue's delivery pass, and when it last ran."""

    __slots__ = ("dispatched_at",)

    def __init__(self) -> None:
        # The last pass (perf_counter_ns; never, at first): ``ClassicQueue.publish`` reads it.
        self.dispatched_at = -(2**63)

    def dispatch(self, queue: DeliverySource) -> None:
        self.dispatched_at = time.perf_counter_ns()
        store = queue.store
        consumers = queue.consumers
        candidates = queue.candidates
        work = Slice()
        while consumers and store.ready_count:
            if len(consumers) == 1 or queue.single_active_consumer:  # one consumer to ask
                active = consumers.first()
                assert active is not None
                delivered = self._deliver_batch(queue, active)
                if delivered < 0:
                    return
            else:
                consumer = candidates.next()
                if consumer is None:
                    return
                try:
                    entry = queue.take(EXPIRE_BATCH)
                except OSError as exc:  # storage trouble: deliver again on the next wake-up
                    log.error(
                        "queue %r in vhost %r: cannot read a message: %s",
                        queue.name,
                        queue.vhost,
                        exc,
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
                candidates.served(consumer)
                delivered = 1
            if work.used(delivered):  # give way: the next pass goes on
                queue.wake()
                return

    def taker(self, queue: DeliverySource) -> Consumer | None:
        """The consumer a message published now would go to at once (None: none can take it)."""
        consumers = queue.consumers
        if len(consumers) == 1 or queue.single_active_consumer:
            active = consumers.first()
            return active if active is not None and active.credit() > 0 else None
        return queue.candidates.next()

    def _deliver_batch(self, queue: DeliverySource, consumer: Consumer) -> int:
        """Deliver to ``consumer`` as many messages as it takes now (``Consumer.credit``, at
        most ``DELIVER_BATCH`` or about ``DELIVER_BATCH_BYTES``) in one ``deliver_many``: the
        per-message work of the round-robin pass (asking for capacity, the channel's counters
        and tag, waking the writer) paid once per batch. How many it delivered; -1: the pass
        ends here (no credit, no live message, the store must flush first, storage trouble)."""
        credit = consumer.credit()
        if credit <= 0:
            return -1
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
        return len(batch) if go_on else -1
