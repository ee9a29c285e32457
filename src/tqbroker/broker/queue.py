"""A classic queue and its actor.

Responsibilities:
- accept messages (``publish``: a plain call that wakes the actor, no message passing per message);
- the actor task: deliver ready messages round-robin to consumers that have prefetch credit;
- basic.get, ack and requeue through the queue's ``QueueStore``;
- consumer bookkeeping (exclusive consumers, auto-delete once the last consumer leaves).

The actor is woken, not messaged: any number of publishes, acks or new consumers between two
wake-ups cost one delivery pass.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import trio

from ..backends.base import QueueStore
from ..model import Message
from ..protocol.codec import FieldTable
from .consumer import Consumer
from .flusher import Flusher

if TYPE_CHECKING:
    from .exchange import BindingRef

log = logging.getLogger("tqbroker.queue")


class QueueFull(Exception):
    """``x-max-length`` reached with ``x-overflow`` reject-publish: the publish is refused."""


class NeedsFlush(enum.Enum):
    NEEDS_FLUSH = enum.auto()


NEEDS_FLUSH: Final = NeedsFlush.NEEDS_FLUSH

# What a publish must wait for before it may be confirmed: a flusher ticket, or nothing.
Durability = tuple[Flusher, int] | None


class Queue:
    def __init__(
        self,
        vhost: str,
        name: str,
        store: QueueStore,
        *,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: FieldTable,
        flusher: Flusher | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.store = store
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        # Set for queues on a durable backend: persistent messages wait for its flushes.
        self.flusher = flusher
        self.backend_name = "memory"
        self.consumers: list[Consumer] = []
        self.bound_by: set[BindingRef] = set()
        self.deleted = False
        self.on_unused: Callable[[Queue], None] | None = None  # set by the vhost (auto-delete)
        self._had_consumer = False
        self._next_consumer: dict[int, int] = {}  # round-robin position per consumer priority
        single = arguments.get("x-single-active-consumer")
        self.single_active_consumer = single is True
        # x-expires: delete the queue after this many seconds unused (no consumer, no
        # basic.get, no redeclare); x-max-length with x-overflow (drop-head or reject-publish).
        expires = arguments.get("x-expires")
        self.expires = expires / 1000 if isinstance(expires, int) else None
        max_length = arguments.get("x-max-length")
        self.max_length = max_length if isinstance(max_length, int) else None
        self.overflow = arguments.get("x-overflow", "drop-head")
        self._last_used = trio.current_time()
        self._wakeup = trio.Event()
        self._cancel_scope = trio.CancelScope()

    # -- the actor ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver until the queue is deleted; expire it when ``x-expires`` says so. Time is
        Trio's clock, so tests drive it with ``trio.testing.MockClock``."""
        with self._cancel_scope:
            while True:
                deadline = math.inf
                if self.expires is not None and not self.consumers:
                    deadline = self._last_used + self.expires
                with trio.move_on_at(deadline):
                    await self._wakeup.wait()
                if not self._wakeup.is_set():
                    if self.on_unused is not None:
                        log.info("queue %r in vhost %r expired", self.name, self.vhost)
                        self.on_unused(self)
                    return
                self._wakeup = trio.Event()
                self._dispatch()

    def touch(self) -> None:
        """The queue was used (basic.get, redeclare, a consumer came or went): restart the
        ``x-expires`` countdown."""
        self._last_used = trio.current_time()
        self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    def stop(self) -> None:
        self._cancel_scope.cancel()

    def _dispatch(self) -> None:
        store = self.store
        consumers = self.consumers
        while consumers and store.ready_count:
            consumer = self._pick_consumer()
            if consumer is None:
                return
            try:
                entry = store.pop()
            except OSError as exc:  # storage trouble: deliver again on the next wake-up
                log.error(
                    "queue %r in vhost %r: cannot read a message: %s", self.name, self.vhost, exc
                )
                return
            if entry is None:
                if store.ready_count and self.flusher is not None:
                    self.flusher.wake_after_flush(self)  # the store needs a flush first
                return
            message_id, message, redelivered = entry
            if store.wants_flush and self.flusher is not None:
                self.flusher.poke()
            if consumer.no_ack:
                store.ack(message_id)
            else:
                consumer.unacked += 1
            consumer.channel.deliver(consumer, message_id, message, redelivered)

    def _pick_consumer(self) -> Consumer | None:
        """The consumer for the next message. With ``x-single-active-consumer`` only the
        earliest registered consumer receives. Otherwise consumers are tried by priority
        (``x-priority``, highest first; the list is kept in that order) and round-robin among
        equals, skipping those without prefetch credit."""
        consumers = self.consumers
        if self.single_active_consumer:
            active = consumers[0]
            return active if active.has_capacity() else None
        n = len(consumers)
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

    # -- messages ----------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """False while the queue's durable backend cannot write (publishes are refused)."""
        return self.flusher is None or self.flusher.backend.healthy

    def publish(self, message: Message) -> Durability:
        """Enqueue; return what a confirm must wait for (None: confirm at once). Raises
        ``QueueFull`` when ``x-max-length`` is reached and the overflow is reject-publish."""
        full = self.max_length is not None and self.store.ready_count >= self.max_length
        if full and self.overflow != "drop-head":
            raise QueueFull(f"queue '{self.name}' is full (x-max-length {self.max_length})")
        flusher = self.flusher
        persistent = self.durable and flusher is not None and message.properties.delivery_mode == 2
        self.store.push(message, persistent)  # OSError: the caller refuses the publish
        if self.max_length is not None:
            self._drop_head()
        if self.consumers:
            self._wakeup.set()
        if persistent:
            assert flusher is not None
            return flusher, flusher.request()
        return None

    def _drop_head(self) -> None:
        """x-overflow drop-head: discard the oldest ready messages beyond ``x-max-length``."""
        store = self.store
        assert self.max_length is not None
        while store.ready_count > self.max_length:
            entry = store.pop()
            if entry is None:  # the store must flush first; the next publish drops more
                break
            store.ack(entry[0])

    def get(self) -> tuple[int, Message, bool] | NeedsFlush | None:
        """The next ready message for ``basic.get``; None when the queue is empty;
        ``NEEDS_FLUSH`` when messages are ready but the store must flush before it may hand
        one out (rare: retry after ``flusher.call_after_flush``)."""
        self.touch()
        try:
            entry = self.store.pop()
        except OSError as exc:
            log.error("queue %r in vhost %r: cannot read a message: %s", self.name, self.vhost, exc)
            return None
        if self.flusher is not None and (self.store.wants_flush or entry is None):
            self.flusher.poke()
            # Wait for the flush only while it can succeed; a backend that cannot write (after
            # a failed fsync it stays so until restart) answers get-empty rather than hanging.
            if entry is None and self.store.ready_count and self.flusher.backend.healthy:
                return NEEDS_FLUSH
        return entry

    def ack(self, message_id: int, consumer: Consumer | None) -> None:
        self.store.ack(message_id)
        if consumer is not None:
            consumer.unacked -= 1
            self._wakeup.set()

    def requeue(self, message_id: int, consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked -= 1
        self.store.requeue(message_id)
        self._wakeup.set()

    def purge(self) -> int:
        return self.store.purge()

    @property
    def message_count(self) -> int:
        return self.store.ready_count

    # -- consumers ---------------------------------------------------------------------------

    @property
    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def add_consumer(self, consumer: Consumer) -> None:
        # Keep the list ordered by priority, highest first, registration order among equals.
        index = len(self.consumers)
        while index and self.consumers[index - 1].priority < consumer.priority:
            index -= 1
        self.consumers.insert(index, consumer)
        self.touch()
        self._had_consumer = True
        self._wakeup.set()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        self.touch()  # also wakes the actor: e.g. the next single active consumer takes over
        if not self.consumers and self.auto_delete and self._had_consumer and self.on_unused:
            self.on_unused(self)

    def __repr__(self) -> str:
        return f"Queue({self.vhost!r}, {self.name!r})"
