"""The classic queue (RabbitMQ's) and its actor.

Responsibilities:
- accept messages (``publish``: a plain call that wakes the actor, no message passing per
  message), enforcing ``x-max-length`` / ``x-max-length-bytes`` with ``x-overflow``;
- the actor task: deliver ready messages to consumers with prefetch credit (the delivery pass
  is the queue's ``Dispatcher``, ``classic_dispatch.py``: batches to a lone consumer or the
  single active one, else to the consumer whose turn it is in the queue's ``ConsumerRing``,
  ``consumer_ring.py``, told of every settlement); expire messages at the head
  (``x-message-ttl``, per-message ``expiration``) and the queue itself (``x-expires``);
- basic.get, ack, reject and requeue through the queue's ``QueueStore``; the returns of each
  message against ``x-delivery-limit`` (``x-delivery-count`` on redeliveries);
- dead-lettering (reasons ``rejected``, ``expired``, ``maxlen``, ``delivery_limit``) through the
  queue's ``QueueHost`` (the vhost).

Timers read Trio's clock (``tqbroker.clock``), so tests drive them with ``MockClock``.

The actor is woken, not messaged: any number of publishes, acks or new consumers between two
wake-ups cost one delivery pass.

Just over 400 lines as one job: the queue's state (its store, consumers, timers, limits) is
changed only here and by its actor, so every rule that reads or changes it sits beside it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Sequence
from typing import Final

import trio

from .. import clock
from ..backends.base import FLUSH_FIRST, FlushFirst, Popped, QueueStore
from ..model import Message
from ..plugins.spec import Durability
from .arguments import QueueArguments
from .classic_dispatch import EXPIRE_BATCH, Dispatcher
from .consumer import Consumer, DeliveryChannel
from .consumer_ring import ConsumerRing
from .deadletter import Reason, message_ttl
from .flusher import Flusher
from .queue import Queue, QueueFull, QueueHost
from .supervisor import Spawn

log = logging.getLogger(__name__)

# A queue that delivered nothing for this long delivers a lone publish at once (``publish``).
DIRECT_DISPATCH_GAP_NS: Final = 200_000


class ClassicQueue(Queue):
    """A classic queue (RabbitMQ's): messages in a ``QueueStore``, each delivered to one
    consumer and removed when acked, with the classic queue arguments. Its ``Dispatcher``
    delivers; the queue is what the dispatcher reads and calls (its ``DeliverySource``:
    ``take``, ``settle``, ``wake_after_flush``)."""

    def __init__(
        self,
        vhost: str,
        name: str,
        store: QueueStore,
        *,
        host: QueueHost,
        backend_name: str,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: QueueArguments,
        flusher: Flusher | None = None,
    ) -> None:
        super().__init__(
            vhost,
            name,
            host=host,
            backend_name=backend_name,
            durable=durable,
            exclusive_owner=exclusive_owner,
            auto_delete=auto_delete,
            arguments=arguments,
            flusher=flusher,
        )
        self.store = store
        self._dispatcher = Dispatcher()
        self.candidates = ConsumerRing()  # the consumers in delivery order
        # The arguments the publish and delivery paths read, as plain attributes.
        self.single_active_consumer = arguments.single_active_consumer
        # x-expires: delete the queue after this many seconds unused (no consumer, no
        # basic.get, no redeclare).
        expires = arguments.expires_ms
        self.expires = expires / 1000 if expires is not None else None
        # Length limits over ready messages, and what happens beyond them.
        self.max_length = arguments.max_length
        self.max_length_bytes = arguments.max_length_bytes
        self.overflow = arguments.overflow
        self.message_ttl = arguments.message_ttl  # ms
        self.dead_letter_exchange = arguments.dead_letter_exchange
        self.delivery_limit = arguments.delivery_limit
        self.consumer_timeout_ms = arguments.consumer_timeout_ms
        # Messages dropped at the delivery limit for want of a dead-letter exchange.
        self.dropped_at_delivery_limit = 0
        # Unacked messages by id, kept only when a reject or a return may need the message
        # (dead-lettering, delivery limit); bounded by the consumers' prefetch.
        self._keep_unacked = self.dead_letter_exchange is not None or (
            self.delivery_limit is not None
        )
        self._unacked_messages: dict[int, Message] = {}
        self._returns: dict[int, int] = {}  # message id -> returns so far (x-delivery-limit)
        # Whether a ready message may carry a TTL: then the actor watches the head. Recovered
        # messages may carry per-message TTLs, so a queue that opens non-empty watches too.
        self._may_expire = self.message_ttl is not None or store.ready_count > 0

    # -- the actor ---------------------------------------------------------------------------

    def begin(self, spawn: Spawn) -> None:
        """The actor starts now if it has time to keep (``x-expires``, messages that may
        expire), else at the first wake-up that gives it work (a consumer with messages
        ready, a publish to a consumed queue...): 100k queues declared and never used cost
        no task each."""
        if self.expires is not None or self._may_expire:
            super().begin(spawn)
        else:
            self._start = spawn

    async def run(self) -> None:
        """Deliver until the queue is deleted; expire it when ``x-expires`` says so. Time is
        Trio's clock, so tests drive it with ``trio.testing.MockClock``."""
        if self._stopped:
            return
        with trio.CancelScope() as self._cancel_scope:
            while True:
                unused_deadline = math.inf
                if self.expires is not None and not self.consumers:
                    unused_deadline = self._last_used + self.expires
                head_deadline = self._expire_head() if self._may_expire else math.inf
                deadline = min(unused_deadline, head_deadline)
                if deadline == math.inf:  # no timer: no cancel scope to make either
                    await self._wakeup.wait()
                else:
                    with trio.move_on_at(deadline):
                        await self._wakeup.wait()
                if self._wakeup.is_set():
                    self._wakeup = trio.Event()
                    self._dispatcher.dispatch(self)
                elif trio.current_time() >= unused_deadline:
                    log.info("queue %r in vhost %r expired", self.name, self.vhost)
                    self.host.queue_unused(self)
                    return

    def wake_after_flush(self) -> None:
        """The store must flush before it hands out more: deliver again after the flush."""
        if self.flusher is not None and not self._wakeup.is_set():
            self.flusher.wake_after_flush(self)

    def take(self, expire_at_most: float = math.inf) -> Popped | FlushFirst | None:
        """Pop the next live message for delivery: expired ones met on the way are
        dead-lettered (past ``expire_at_most`` of them, give up: None, actor woken to go on);
        a message returned before carries ``x-delivery-count``. ``FLUSH_FIRST`` as the store
        says it."""
        store = self.store
        expired = 0
        while True:
            entry = store.pop()
            if store.wants_flush and self.flusher is not None:
                self.flusher.poke()
            if entry is None or entry is FLUSH_FIRST:
                return entry
            message_id, message, redelivered = entry
            if self._may_expire and self._expired(message, clock.now_ms()):
                self._discard(message_id, message, "expired")
                expired += 1
                if expired >= expire_at_most:
                    self.wake()
                    return None
                continue
            if self._keep_unacked:
                self._unacked_messages[message_id] = message
                returns = self._returns.get(message_id)
                if returns:
                    headers = message.properties.headers or {}
                    message = message.with_headers({**headers, "x-delivery-count": returns})
            return message_id, message, redelivered

    # -- expiry and dead-lettering -----------------------------------------------------------

    def _expires_at(self, message: Message) -> int | None:
        """Epoch ms after which the message is expired: the lower of the queue's and the
        message's TTL, counted from its arrival."""
        ttl = message_ttl(message)
        if self.message_ttl is not None:
            ttl = self.message_ttl if ttl is None else min(ttl, self.message_ttl)
        return None if ttl is None else message.timestamp_ms + ttl

    def _expired(self, message: Message, now_ms: int) -> bool:
        expires_at = self._expires_at(message)
        return expires_at is not None and now_ms > expires_at

    def _expire_head(self) -> float:
        """Dead-letter expired messages at the head, as RabbitMQ's classic queues do; return
        the Trio time at which the head expires next (inf: no TTL at the head). At most
        ``EXPIRE_BATCH`` per call, so that a mass expiry lets other tasks run in between (the
        returned time is then now)."""
        store = self.store
        now = clock.now_ms()
        for _ in range(EXPIRE_BATCH):
            try:
                entry = store.peek()
            except OSError as exc:
                log.error(
                    "queue %r in vhost %r: cannot read a message: %s", self.name, self.vhost, exc
                )
                return math.inf
            if entry is None:
                return math.inf
            if entry is FLUSH_FIRST:
                if self.flusher is not None:
                    self.flusher.wake_after_flush(self)
                return math.inf
            expires_at = self._expires_at(entry[1])
            if expires_at is None:
                return math.inf
            if now <= expires_at:
                return clock.to_trio(expires_at + 1)
            popped = store.pop()
            if popped is None or popped is FLUSH_FIRST:  # peek said it would not; be safe
                return math.inf
            self._discard(popped[0], popped[1], "expired")
        return trio.current_time()

    def _discard(self, message_id: int, message: Message, reason: Reason) -> None:
        """Remove a message from the queue for good and dead-letter it."""
        self.settle(message_id)
        if self.dead_letter_exchange is not None:
            self.host.dead_letter(self, message, reason)

    def settle(self, message_id: int) -> None:
        """Remove a message for good (acked, delivered to a ``no_ack`` consumer, discarded)."""
        self.store.ack(message_id)
        if self._keep_unacked:
            self._unacked_messages.pop(message_id, None)
            self._returns.pop(message_id, None)

    # -- messages ----------------------------------------------------------------------------

    def publish(self, message: Message) -> Durability:
        """Enqueue; return what a confirm must wait for (None: confirm at once). Raises
        ``QueueFull`` when a length limit is reached and the overflow is reject-publish(-dlx)
        (with -dlx the message is dead-lettered too)."""
        limited = self.max_length is not None or self.max_length_bytes is not None
        if limited and self.overflow != "drop-head" and self._over_limit(1, len(message.body)):
            if self.overflow == "reject-publish-dlx":
                self._discard_new(message, "maxlen")
            raise QueueFull(f"queue '{self.name}' in vhost '{self.vhost}' is full")
        ttl = message_ttl(message)
        if ttl is not None:
            self._may_expire = True
        # TTL 0: delivered now if a consumer can take it at once, else expired.
        deliver_now = self.message_ttl == 0 or ttl == 0
        if deliver_now and (self.store.ready_count or self._dispatcher.taker(self) is None):
            self._discard_new(message, "expired")
            return None
        flusher = self.flusher
        persistent = self.durable and flusher is not None and message.properties.delivery_mode == 2
        self.store.push(message, persistent)  # OSError: the caller refuses the publish
        self.stats.publish += 1
        if deliver_now or (limited and self.consumers):
            # Deliver before counting against the limit, as RabbitMQ does: a consumer with
            # credit takes the message instead of it piling up (and being dropped or refused).
            self._dispatcher.dispatch(self)
        if limited:
            self._drop_head()
        if self.consumers or self._may_expire:
            # An idle queue delivers a lone message now, a hop sooner than its actor would.
            dispatcher = self._dispatcher
            idle = time.perf_counter_ns() - dispatcher.dispatched_at >= DIRECT_DISPATCH_GAP_NS
            if (
                idle
                and self.store.ready_count == 1
                and not (self._may_expire or self._wakeup.is_set())
            ):
                dispatcher.dispatch(self)
            else:
                self.wake()
        if persistent:
            assert flusher is not None
            return flusher, flusher.request()
        return None

    def publish_run(self, messages: Sequence[Message]) -> tuple[list[Durability], Exception | None]:
        """``publish`` of each of ``messages``, with the checks that hold for the whole run
        made once: the first goes through ``publish`` (an idle queue delivers it at once), the
        rest are pushed one after another and the actor is woken once, unless a length limit,
        a queue TTL of 0 or a message's own TTL asks for ``publish``'s per-message rules."""
        if (
            len(messages) == 1
            or self.max_length is not None
            or self.max_length_bytes is not None
            or self.message_ttl == 0
        ):
            return super().publish_run(messages)
        durabilities: list[Durability] = []
        try:
            durabilities.append(self.publish(messages[0]))
        except Exception as exc:  # the caller refuses this one, as for ``publish``
            return durabilities, exc
        flusher = self.flusher
        durable = self.durable and flusher is not None
        push, publish, taken = self.store.push, self.publish, durabilities.append
        pushed = 0
        error: Exception | None = None
        try:
            for message in messages[1:]:
                if message_ttl(message) is not None:  # its own TTL: the full rules
                    taken(publish(message))
                    continue
                persistent = durable and message.properties.delivery_mode == 2
                push(message, persistent)  # OSError: the caller refuses this one
                pushed += 1
                if persistent:
                    assert flusher is not None
                    taken((flusher, flusher.request()))
                else:
                    taken(None)
        except Exception as exc:
            error = exc
        self.stats.publish += pushed
        if pushed and (self.consumers or self._may_expire):
            self.wake()
        return durabilities, error

    def _over_limit(self, extra_messages: int = 0, extra_bytes: int = 0) -> bool:
        store = self.store
        return (
            self.max_length is not None and store.ready_count + extra_messages > self.max_length
        ) or (
            self.max_length_bytes is not None
            and store.ready_bytes + extra_bytes > self.max_length_bytes
        )

    @property
    def dead_letters_on_publish(self) -> bool:
        # Past a length limit or a TTL of 0, a publish discards a message: dead-lettered if
        # the queue has a dead-letter exchange.
        return self.dead_letter_exchange is not None

    def _discard_new(self, message: Message, reason: Reason) -> None:
        """Dead-letter a message that never entered the queue."""
        if self.dead_letter_exchange is not None:
            self.host.dead_letter(self, message, reason)

    def _drop_head(self) -> None:
        """x-overflow drop-head: dead-letter the oldest ready messages while over a limit."""
        store = self.store
        while self._over_limit():
            entry = store.pop()
            if entry is None or entry is FLUSH_FIRST:  # FLUSH_FIRST: the next publish drops more
                break
            self._discard(entry[0], entry[1], "maxlen")

    def get(self) -> Popped | FlushFirst | None:
        """The next ready message for ``basic.get``; None when the queue is empty;
        ``FLUSH_FIRST`` when messages are ready but the store must flush before it may hand
        one out (rare: retry after ``flusher.call_after_flush``)."""
        self.touch()
        try:
            entry = self.take()
        except OSError as exc:
            log.error("queue %r in vhost %r: cannot read a message: %s", self.name, self.vhost, exc)
            return None
        if self.flusher is not None and (self.store.wants_flush or entry is FLUSH_FIRST):
            self.flusher.poke()
        if entry is FLUSH_FIRST and not (self.flusher is not None and self.flusher.healthy):
            # Wait for the flush only while it can succeed; a backend that cannot write (after
            # a failed fsync it stays so until restart) answers get-empty rather than hanging.
            return None
        return entry

    def ack(self, message_id: int, consumer: Consumer | None) -> None:
        self.settle(message_id)
        if consumer is not None:
            consumer.unacked -= 1
            self.candidates.credit_returned(consumer)
            self.wake()

    def ack_many(self, message_ids: list[int], consumer: Consumer | None) -> None:
        for message_id in message_ids:
            self.settle(message_id)
        if consumer is not None:
            consumer.unacked -= len(message_ids)
            self.candidates.credit_returned(consumer)
            self.wake()

    def reject(self, message_id: int, consumer: Consumer | None) -> None:
        """basic.reject / basic.nack without requeue: remove and dead-letter (``rejected``)."""
        message = self._unacked_messages.get(message_id)
        self.ack(message_id, consumer)
        if message is not None and not self.deleted:
            self._discard_new(message, "rejected")

    def requeue(self, message_id: int, consumer: Consumer | None) -> None:
        """Return an unacked message to the queue. Every return counts against
        ``x-delivery-limit``; past it the message is dead-lettered (``delivery_limit``) or,
        without a dead-letter exchange, dropped and counted in the log."""
        if consumer is not None:
            consumer.unacked -= 1
            self.candidates.credit_returned(consumer)
        self.wake()
        if self.delivery_limit is not None:
            returns = self._returns.get(message_id, 0) + 1
            message = self._unacked_messages.pop(message_id, None)
            if returns > self.delivery_limit and message is not None and not self.deleted:
                self.settle(message_id)
                if self.dead_letter_exchange is None:
                    self.dropped_at_delivery_limit += 1
                    log.warning(
                        "queue %r in vhost %r dropped a message returned %d times "
                        "(x-delivery-limit %d, no x-dead-letter-exchange; %d dropped so far)",
                        self.name,
                        self.vhost,
                        returns,
                        self.delivery_limit,
                        self.dropped_at_delivery_limit,
                    )
                self._discard_new(message, "delivery_limit")
                return
            self._returns[message_id] = returns
        elif self._keep_unacked:
            self._unacked_messages.pop(message_id, None)
        self.store.requeue(message_id)
        if self.overflow == "drop-head" and (
            self.max_length is not None or self.max_length_bytes is not None
        ):
            self._drop_head()  # a requeue may push the queue over its limit, as in RabbitMQ

    def purge(self) -> int:
        """Drop the ready messages (not dead-lettered, as in RabbitMQ)."""
        if self._returns:  # forget the returns of purged messages; unacked ones keep theirs
            self._returns = {i: n for i, n in self._returns.items() if i in self._unacked_messages}
        return self.store.purge()

    @property
    def message_count(self) -> int:
        return self.store.ready_count

    # -- consumers ---------------------------------------------------------------------------

    def touch(self) -> None:
        """``Queue.touch``; the actor is woken only if it has something to do: a countdown
        to restart, or messages for the consumers (100k consumes on idle queues wake none)."""
        self._last_used = trio.current_time()
        if self.expires is not None or self.store.ready_count:
            self.wake()

    def add_consumer(self, consumer: Consumer) -> None:
        self.candidates.add(consumer)
        super().add_consumer(consumer)

    def remove_consumers(self, gone: Collection[Consumer]) -> None:
        self.candidates.remove_all(gone)
        super().remove_consumers(gone)

    def cancel_consumers(self) -> None:
        self.candidates.clear()
        super().cancel_consumers()

    def channel_ready(self, channel: DeliveryChannel) -> None:
        self.candidates.channel_ready(channel)
        if self.store.ready_count:  # else nothing to deliver: the next publish wakes it
            self.wake()
