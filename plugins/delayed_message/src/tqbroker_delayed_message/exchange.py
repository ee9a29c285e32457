"""The ``x-delayed-message`` exchange type: RabbitMQ's delayed-message exchange for tqbroker.

Responsibilities:
- ``DelayedMessageExchange`` (the entry point): the declare argument ``x-delayed-type`` names the
  exchange type whose routing the exchange has (direct, topic, fanout, headers or any other
  loaded type); missing, unknown or ``x-delayed-message`` itself is refused with 406;
- ``DelayedRouter``: bindings go to a router of that type; a message whose ``x-delay`` header is
  a positive number of milliseconds goes to the exchange's ``DelayedMessages`` instead, any other
  is routed at once;
- ``DelayedMessages``: holds the delayed messages (a heap by due time, each also in the
  exchange's store) and, in one task per exchange sleeping until the earliest due time, routes
  them through the exchange's bindings of that moment.

What RabbitMQ's plugin does, and this does too (rabbitmq/rabbitmq-delayed-message-exchange,
``rabbit_exchange_type_delayed_message.erl``, ``rabbit_delayed_message_utils.erl``,
``rabbit_delayed_message.erl``):
- ``x-delay`` integers are the delay; floats are truncated; strings holding an integer are
  parsed (for STOMP); absent, zero, negative or any other type: routed at once;
- a delayed message is delivered with ``x-delay`` set to minus the delay (so it is not delayed
  again if it crosses another delayed exchange, and consumers see that it was delayed);
- it is routed when due, through the bindings (and alternate exchange) of that moment;
- ``mandatory``: a delayed message counts as unroutable when published, so a mandatory publish
  gets ``basic.return`` 312 NO_ROUTE at once, and the message is still delivered when due.
Where this differs: a string that is not an integer routes at once (RabbitMQ's
``binary_to_integer`` fails on it with ``badarg`` while routing the publish); a delay above
2^32-1 ms is honoured (RabbitMQ routes it at once, its issue #227); the alternate exchange is
consulted only when the message is due (RabbitMQ also hands it to the alternate exchange at
publish time, its issue #36); a confirm waits until a persistent delayed message is on disk
(RabbitMQ confirms at once).

Durability: the store is the broker's durable backend for a durable exchange (memory otherwise);
a persistent message (delivery_mode 2) there survives a restart, clean or not, and is delivered
at its original due time (at once if overdue). Its due time travels in a 9-byte envelope in front
of the stored body (``_ENVELOPE``). Once delivered, a message is acked in the store only after
the queues it reached have made it durable, so a crash in between delivers it again rather than
losing it (at-least-once).

Over 400 lines as one job: the exchange type, its router and its held messages share one
store and one due-time envelope; they are one plugin's single entry point.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
import struct
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Final

import trio

from tqbroker.plugins import (
    FLUSH_FIRST,
    Durability,
    ExchangeContext,
    FieldTable,
    GroupCommit,
    HoldingRouter,
    Message,
    Router,
    now_ms,
    to_trio,
)

log = logging.getLogger(__name__)

TYPE_NAME: Final = "x-delayed-message"
TYPE_ARGUMENT: Final = "x-delayed-type"
DELAY_HEADER: Final = "x-delay"

# The stored form of a held message: version 1, due time (epoch ms), then the body.
_ENVELOPE: Final = struct.Struct(">BQ")
_ENVELOPE_VERSION: Final = 1
_MAX_DELAY: Final = 2**63 - 1  # x-delay is re-encoded negated: keep it a signed 64-bit integer
_MAX_DUE: Final = 2**64 - 1
# An integer as Erlang's binary_to_integer reads it (ASCII digits, optional sign).
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
# Due messages routed between two checkpoints, so a burst does not hold up the broker.
_BATCH: Final = 500


def parse_delay(headers: FieldTable | None) -> int | None:
    """The ``x-delay`` header as RabbitMQ's plugin reads it, in ms; None when absent or of a type
    it does not take (the message is then routed at once, as for a delay <= 0)."""
    if not headers:
        return None
    value = headers.get(DELAY_HEADER)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return math.trunc(value) if math.isfinite(value) else None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        return int(value)
    return None


class DelayedMessageExchange:
    """The ``x-delayed-message`` exchange type (the entry point)."""

    def validate(self, arguments: FieldTable) -> None:
        kind = arguments.get(TYPE_ARGUMENT)
        if kind == TYPE_NAME:
            raise ValueError(f"Invalid argument, '{TYPE_NAME}' can't be used for '{TYPE_ARGUMENT}'")
        if not isinstance(kind, str | bytes):
            raise ValueError(
                f"Invalid argument, '{TYPE_ARGUMENT}' must be an existing exchange type"
            )

    def create_router(self, arguments: FieldTable) -> DelayedRouter:
        return DelayedRouter(arguments)


class DelayedRouter:
    """Routes like the ``x-delayed-type`` exchange type, except for messages to delay."""

    def __init__(self, arguments: FieldTable) -> None:
        self._arguments = arguments
        self._inner: Router | None = None
        self._held: DelayedMessages | None = None
        self._hold: tuple[Hashable, ...] = ()

    @property
    def held(self) -> DelayedMessages:
        """The exchange's delayed messages (once open)."""
        assert self._held is not None
        return self._held

    def open(self, context: ExchangeContext) -> None:
        kind = self._arguments.get(TYPE_ARGUMENT)
        if isinstance(kind, bytes):
            kind = kind.decode("utf-8", "replace")
        assert isinstance(kind, str)  # validate() saw to it
        exchange_type = context.exchange_types.get(kind)
        if exchange_type is None:
            # What RabbitMQ's rabbit_exchange:check_type answers (406 since RabbitMQ 3.13).
            raise ValueError(f"unknown exchange type '{kind}'")
        exchange_type.validate(self._arguments)
        inner = exchange_type.create_router(self._arguments)
        if isinstance(inner, HoldingRouter):
            raise ValueError(
                f"Invalid argument, '{TYPE_ARGUMENT}' '{kind}' holds messages itself and cannot "
                "be delayed"
            )
        self._inner = inner
        self._held = DelayedMessages(context)
        self._hold = (self._held,)

    def delete(self) -> None:
        if self._held is not None:
            self._held.delete()

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        assert self._inner is not None
        self._inner.bind(destination, binding_key, arguments)

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        assert self._inner is not None
        self._inner.unbind(destination, binding_key, arguments)

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        if headers and DELAY_HEADER in headers:
            delay = parse_delay(headers)
            if delay is not None and delay > 0:
                return self._hold
        assert self._inner is not None
        return self._inner.route(routing_key, headers)


class DelayedMessages:
    """The delayed messages of one exchange: a ``Destination`` (the router hands it messages to
    delay) and a ``FlushListener`` (delivered messages are acked in the store once durable in
    their queues).

    In memory: a heap of ``(due ms, store id, exchange, routing key, properties, body)``, plain
    values only, so that the garbage collector has nothing to traverse however many wait.

    Store bookkeeping: the store hands out messages in id order only, and a message is acked by
    id once popped; so every message is popped right after its push (``_drain``), recovered ones
    first. A message delivered before its pop (the store may pause pops until a flush) is acked
    when popped. Acks go to the store in batches, at most every ``ACK_INTERVAL`` seconds: acks
    come in due order, not id order, and a backend may rewrite its whole ack state whenever it
    changed (the log backend's checkpoint does)."""

    ACK_INTERVAL: Final = 0.25

    def __init__(self, context: ExchangeContext) -> None:
        self.name = context.exchange
        self._context = context
        self._durable = context.durable
        self._store = context.open_store()
        self._commit = context.group_commit
        # A store that survives restarts keeps each message's due time in an envelope.
        self._enveloped = self._commit is not None
        # Ids break ties between equal due times in publish order.
        self._heap: list[tuple[int, int, str, str, bytes, bytes]] = []
        self._to_recover = self._store.ready_count  # what a previous run left, popped first
        self._popped = 0  # the highest id popped (ids increase; nothing is ever requeued)
        self._ack_when_popped: set[int] = set()
        self._acks: list[int] = []  # popped, delivered, not yet acked in the store
        self._acks_due = math.inf  # Trio time at which ``_acks`` go to the store
        # Delivered persistent messages waiting for their queues' flushes: (id, tickets).
        self._awaiting: deque[tuple[int, list[tuple[GroupCommit, int]]]] = deque()
        self._listening: set[GroupCommit] = set()
        self._drain_scheduled = False
        self._deleted = False
        self._timer: trio.CancelScope | None = None  # the sleep until the next deadline
        self._scope = trio.CancelScope()
        self.delivered = 0
        self._drain()
        context.spawn(self._run)

    def __len__(self) -> int:
        """Messages waiting for their due time (RabbitMQ's ``messages_delayed``)."""
        return len(self._heap)

    # -- Destination -------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self._commit is None or self._commit.healthy

    def publish(self, message: Message) -> Durability:
        properties = message.properties
        delay = min(max(parse_delay(properties.headers) or 0, 0), _MAX_DELAY)
        due = min(now_ms() + delay, _MAX_DUE)
        # Delivered with x-delay negated, as RabbitMQ delivers it.
        raw = message.with_headers(
            {**(properties.headers or {}), DELAY_HEADER: -delay}
        ).properties_raw
        commit = self._commit
        persistent = self._durable and commit is not None and properties.delivery_mode == 2
        body = message.body
        stored = Message(
            message.exchange,
            message.routing_key,
            raw,
            _ENVELOPE.pack(_ENVELOPE_VERSION, due) + body if self._enveloped else body,
        )
        message_id = self._store.push(stored, persistent)  # OSError: the publish is refused
        heapq.heappush(
            self._heap, (due, message_id, message.exchange, message.routing_key, raw, body)
        )
        self._drain()
        self._rearm(to_trio(due))
        if persistent:
            assert commit is not None
            return commit, commit.request()
        return None

    # -- the store ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Pop what the store has ready: recover what a previous run left, ack what was
        delivered before its pop."""
        store = self._store
        while store.ready_count:
            try:
                entry = store.pop()
            except OSError as exc:
                log.error("exchange %r: cannot read a delayed message: %s", self.name, exc)
                entry = FLUSH_FIRST  # try again after the next flush
            if entry is None:
                break
            if entry is FLUSH_FIRST:
                if self._commit is not None and not self._drain_scheduled:
                    self._drain_scheduled = True
                    self._commit.call_after_flush(self._after_flush)
                break
            message_id, stored, _redelivered = entry
            self._popped = message_id
            if self._to_recover:
                self._to_recover -= 1
                self._recover(message_id, stored)
            elif message_id in self._ack_when_popped:
                self._ack_when_popped.discard(message_id)
                self._ack(message_id)
        if store.wants_flush and self._commit is not None:
            self._commit.poke()

    def _after_flush(self) -> None:
        self._drain_scheduled = False
        if not self._deleted:
            self._drain()

    def _recover(self, message_id: int, stored: Message) -> None:
        body = stored.body
        if not self._enveloped or len(body) < _ENVELOPE.size or body[0] != _ENVELOPE_VERSION:
            log.error(
                "exchange %r: stored message %d is not delayed; dropped", self.name, message_id
            )
            self._store.ack(message_id)
            return
        _version, due = _ENVELOPE.unpack_from(body)
        entry = (due, message_id, stored.exchange, stored.routing_key, stored.properties_raw)
        heapq.heappush(self._heap, (*entry, bytes(body[_ENVELOPE.size :])))
        self._rearm(to_trio(due))

    def _ack(self, message_id: int) -> None:
        """Ack in the store with the next batch (once popped)."""
        if message_id > self._popped:
            self._ack_when_popped.add(message_id)
            return
        if not self._acks:
            self._acks_due = trio.current_time() + self.ACK_INTERVAL
            self._rearm(self._acks_due)
        self._acks.append(message_id)

    def _ack_batch(self) -> None:
        acks, self._acks = self._acks, []
        self._acks_due = math.inf
        store = self._store
        for message_id in acks:
            store.ack(message_id)
        if store.wants_flush and self._commit is not None:
            self._commit.poke()

    # -- the timer ---------------------------------------------------------------------------

    def _rearm(self, deadline: float) -> None:
        """Wake the timer earlier if ``deadline`` (Trio time) comes before its own."""
        timer = self._timer
        if timer is not None and deadline < timer.deadline:
            timer.deadline = deadline

    async def _run(self) -> None:
        """Sleep until the earliest due time or ack batch (moved by ``_rearm``); deliver what
        is due, ack what is delivered. When the broker stops, the last batch of acks goes to
        the store, which its backend then closes cleanly."""
        try:
            with self._scope:
                while True:
                    due = to_trio(self._heap[0][0]) if self._heap else math.inf
                    with trio.CancelScope(deadline=min(due, self._acks_due)) as timer:
                        self._timer = timer
                        await trio.sleep_forever()
                    self._timer = None
                    await self._deliver_due()
                    if self._acks_due <= trio.current_time():
                        self._ack_batch()
        finally:
            self._timer = None
            if self._acks and not self._deleted:
                self._ack_batch()

    async def _deliver_due(self) -> None:
        heap = self._heap
        batch = 0
        while heap and to_trio(heap[0][0]) <= trio.current_time():
            _due, message_id, exchange, routing_key, raw, body = heapq.heappop(heap)
            # It enters its queues now: their TTLs count from here.
            self._deliver(message_id, Message(exchange, routing_key, raw, body, None, now_ms()))
            batch += 1
            if batch == _BATCH:
                batch = 0
                await trio.lowlevel.checkpoint()

    def _deliver(self, message_id: int, message: Message) -> None:
        """Route a due message through the exchange's bindings now."""
        waits = self._context.publish(message)
        self.delivered += 1
        persistent = self._durable and message.properties.delivery_mode == 2
        if not (waits and persistent):
            self._ack(message_id)
            return
        self._awaiting.append((message_id, waits))
        for commit, _ticket in waits:
            if commit not in self._listening:
                self._listening.add(commit)
                commit.listen(self)

    # -- FlushListener -----------------------------------------------------------------------

    def flushed(self, commit: GroupCommit) -> None:
        still: deque[tuple[int, list[tuple[GroupCommit, int]]]] = deque()
        for message_id, waits in self._awaiting:
            if all(f.completed >= ticket for f, ticket in waits):
                self._ack(message_id)
            else:
                still.append((message_id, waits))
        self._awaiting = still
        self._stop_listening_if_idle()

    def flush_failed(self, commit: GroupCommit, upto: int) -> None:
        """A queue's write failed: keep those messages in the store (they come back after a
        restart) rather than ack what may be lost."""
        self._awaiting = deque(
            (message_id, waits)
            for message_id, waits in self._awaiting
            if not any(f is commit and f.completed < t <= upto for f, t in waits)
        )
        self._stop_listening_if_idle()

    def _stop_listening_if_idle(self) -> None:
        if not self._awaiting:
            for commit in self._listening:
                commit.unlisten(self)
            self._listening.clear()

    # -- deletion ----------------------------------------------------------------------------

    def delete(self) -> None:
        """The exchange was deleted: its delayed messages go with it."""
        self._deleted = True
        self._scope.cancel()
        self._heap.clear()
        self._acks.clear()
        self._awaiting.clear()
        self._ack_when_popped.clear()
        self._stop_listening_if_idle()
        self._context.delete_store()
