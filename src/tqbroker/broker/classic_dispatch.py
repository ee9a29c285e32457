"""The delivery pass of a classic queue (``ClassicQueue._dispatch``), run by its actor on every
wake-up: ready messages go to consumers with prefetch credit.

- A queue with one consumer to ask (the commonest case, and every queue of a fanout with a
  consumer each; with ``x-single-active-consumer``, the active one) hands it a batch: as many
  messages as its ``credit`` allows, at most ``DELIVER_BATCH`` (or about
  ``DELIVER_BATCH_BYTES``), in one ``DeliveryChannel.deliver_many``, so that asking for
  capacity, the channel's counters and tags and the writer's wake-up cost once per batch.
- Otherwise message by message: consumers by priority (``x-priority``, highest first), round-
  robin among equals, skipping those without credit.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Final

import trio

from ..backends.base import FLUSH_FIRST, FlushFirst, Popped, QueueStore
from .consumer import DELIVER_BATCH_BYTES, Consumer

log = logging.getLogger(__name__)

# Messages a queue expires (or skips as expired) in one go before letting other tasks run.
EXPIRE_BATCH: Final = 1000
# At most this many messages go to a consumer in one batch (or about DELIVER_BATCH_BYTES).
DELIVER_BATCH: Final = 1000


class DeliveryPass:
    """The delivery pass, mixed into ``ClassicQueue`` (which provides what is declared here)."""

    name: str
    vhost: str
    store: QueueStore
    consumers: list[Consumer]
    single_active_consumer: bool
    _next_consumer: dict[int, int]
    _wakeup: trio.Event
    _dispatched_at: int  # the last pass (perf_counter_ns): ``ClassicQueue.publish`` reads it

    if TYPE_CHECKING:  # provided by ``ClassicQueue``

        def _take(self, expire_at_most: float = math.inf) -> Popped | FlushFirst | None: ...

        def _settle(self, message_id: int) -> None: ...

        def _after_flush(self) -> None:
            """The store must flush before it hands out more: run the pass again after it."""

    def _dispatch(self) -> None:
        self._dispatched_at = time.perf_counter_ns()
        store = self.store
        consumers = self.consumers
        while consumers and store.ready_count:
            if len(consumers) == 1 or self.single_active_consumer:  # one consumer to ask
                if not self._deliver_batch(consumers[0]):
                    return
                continue
            consumer = self._pick_consumer()
            if consumer is None:
                return
            try:
                entry = self._take(expire_at_most=EXPIRE_BATCH)
            except OSError as exc:  # storage trouble: deliver again on the next wake-up
                log.error(
                    "queue %r in vhost %r: cannot read a message: %s", self.name, self.vhost, exc
                )
                return
            if entry is None:
                return
            if entry is FLUSH_FIRST:
                self._after_flush()
                return
            message_id, message, redelivered = entry
            if consumer.no_ack:
                self._settle(message_id)
            else:
                consumer.unacked += 1
            consumer.channel.deliver(consumer, message_id, message, redelivered)

    def _deliver_batch(self, consumer: Consumer) -> bool:
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
        take = self._take
        try:
            while len(batch) < credit and size < DELIVER_BATCH_BYTES:
                entry = take(EXPIRE_BATCH)
                if entry is None:
                    go_on = False
                    break
                if entry is FLUSH_FIRST:
                    self._after_flush()
                    go_on = False
                    break
                batch.append(entry)
                size += len(entry[1].body)
        except OSError as exc:  # storage trouble: deliver again on the next wake-up
            log.error("queue %r in vhost %r: cannot read a message: %s", self.name, self.vhost, exc)
            go_on = False
        if batch:
            if consumer.no_ack:
                for entry in batch:
                    self._settle(entry[0])
            else:
                consumer.unacked += len(batch)
            consumer.channel.deliver_many(consumer, batch)
        return go_on

    def _pick_consumer(self) -> Consumer | None:
        """The consumer for the next message. With ``x-single-active-consumer`` only the
        earliest registered consumer receives. Otherwise consumers are tried by priority
        (``x-priority``, highest first; the list is kept in that order) and round-robin among
        equals, skipping those without prefetch credit."""
        consumers = self.consumers
        n = len(consumers)
        if n == 1 or self.single_active_consumer:  # one to ask (the commonest case)
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
