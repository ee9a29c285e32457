"""A virtual host: its exchanges, queues and bindings, and the AMQP rules for changing them.

Responsibilities:
- declare / delete / bind / unbind for exchanges and queues with RabbitMQ's checks and reply codes
  (reserved ``amq.`` names 403, missing entities 404, exclusive queues 405, inequivalent
  redeclare 406, unknown exchange type 503);
- routing a message through exchange-to-exchange bindings and alternate exchanges (a plain
  function call, no task);
- the route memo: where a routing key goes from an exchange, kept while every exchange on the way
  is ``cacheable`` (its router promises a result that depends only on the routing key and the
  bindings: direct, fanout, topic; not headers, holding or per-call routers), forgotten as a whole
  whenever routing state changes (a binding, an exchange or a queue comes or goes), and at most
  ``ROUTE_MEMO_SIZE`` entries;
- exclusive and auto-delete lifetimes;
- dead-lettering: routing a queue's expired, rejected, dropped or over-limit messages to its
  dead-letter exchange (``x-death`` and cycles in ``deadletter``);
- the stores behind a queue: one per priority level for ``x-max-priority`` queues.

Everything here is synchronous and runs on the broker's Trio thread; queue actors are started
through the ``spawn`` callback the broker passes in.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final, NoReturn, Protocol, cast

from .. import clock
from ..backends.base import Backend, QueueStore
from ..backends.log import LogBackend
from ..backends.log.stream import LogStream
from ..model import Message
from ..plugins.builtin.direct import DirectRouter
from ..plugins.spec import Destination, ExchangeType, HoldingRouter
from ..protocol.codec import FieldTable, FieldValue, encode_table
from ..protocol.errors import AMQPError, ReplyCode
from ..protocol.methods import BasicProperties
from .deadletter import Reason, dead_lettered, is_cycle
from .exchange import DefaultExchange, Exchange
from .flusher import Flusher
from .groups import ConsumerGroups
from .holding import BrokerExchangeContext, HoldingExchange
from .priority import PriorityStore, level_store_names
from .queue import ClassicQueue, Queue, QueueFull
from .stream import StreamQueue, parse_interval

log = logging.getLogger("tqbroker.vhost")

PREDECLARED: Final = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

Spawn = Callable[[Callable[[], Any]], None]

# The most (exchange, routing key) routes a vhost memoises; it forgets them all past that, so that
# random routing keys cannot grow it without limit.
ROUTE_MEMO_SIZE: Final = 10_000

# RabbitMQ's direct reply-to pseudo-queue and the prefix of the names it hands out.
REPLY_TO: Final = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX: Final = REPLY_TO + "."


class ReplyConsumer(Protocol):
    """A channel consuming from ``amq.rabbitmq.reply-to`` (direct reply-to)."""

    def deliver_reply(self, message: Message) -> None: ...


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class VirtualHost:
    def __init__(
        self,
        name: str,
        *,
        exchange_types: Mapping[str, ExchangeType],
        backends: Mapping[str, Backend],
        flushers: Mapping[str, Flusher],
        durable_backend: str,
        spawn: Spawn,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.exchange_types = exchange_types
        self.backends = backends
        self.flushers = flushers
        self.durable_backend = durable_backend
        self._spawn = spawn
        # Called after a change to durable definitions (exchanges, queues, bindings).
        self._on_change = on_change
        self.queues: dict[str, Queue] = {}
        # (exchange, routing key) -> where ``route`` sends it, for cacheable routes only: tuples,
        # shared by every caller (never mutated). Cleared by ``_routing_changed``.
        self._route_memo: dict[tuple[Exchange, str], tuple[Destination, ...]] = {}
        # Direct reply-to: "amq.rabbitmq.reply-to.<token>" -> the channel consuming replies.
        self.reply_consumers: dict[str, ReplyConsumer] = {}
        self.consumer_groups = ConsumerGroups(spawn)  # on streams (x-stream-group)
        self.default_exchange = DefaultExchange(self.queues, DirectRouter())  # type: ignore[arg-type]
        self.exchanges: dict[str, Exchange] = {"": self.default_exchange}
        for name_, type_name in PREDECLARED:
            if type_name in exchange_types:
                self.exchanges[name_] = self._new_exchange(
                    name_, type_name, durable=True, auto_delete=False, internal=False, arguments={}
                )

    # -- lookups -----------------------------------------------------------------------------

    def _not_found(self, kind: str, name: str) -> AMQPError:
        return AMQPError(ReplyCode.NOT_FOUND, f"no {kind} '{name}' in vhost '{self.name}'")

    def get_exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise self._not_found("exchange", name)
        return exchange

    def get_queue(self, name: str, owner: object) -> Queue:
        """The queue, if it exists and ``owner`` (a connection) may use it."""
        queue = self.queues.get(name)
        if queue is None:
            raise self._not_found("queue", name)
        self._check_exclusive(queue, owner)
        return queue

    def _check_exclusive(self, queue: Queue, owner: object) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not owner:
            self._lock_error(queue)

    def _lock_error(self, queue: Queue) -> NoReturn:
        raise AMQPError(
            ReplyCode.RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{queue.name}' in vhost "
            f"'{self.name}'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.",
        )

    # -- exchanges ---------------------------------------------------------------------------

    def _new_exchange(
        self,
        name: str,
        type_name: str,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
        store_backend: str | None = None,
        restoring: bool = False,
    ) -> Exchange:
        exchange_type = self.exchange_types[type_name]
        try:
            exchange_type.validate(arguments)
        except ValueError as exc:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, str(exc)) from None
        router = exchange_type.create_router(arguments)
        holding = isinstance(router, HoldingRouter)
        exchange = (HoldingExchange if holding else Exchange)(
            name,
            type_name,
            router,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        if not isinstance(exchange, HoldingExchange) or not isinstance(router, HoldingRouter):
            return exchange
        # An exchange type that holds messages: its router gets a context (plugins.spec).
        exchange.context = BrokerExchangeContext(
            self, exchange, spawn=self._spawn, store_backend=store_backend, restoring=restoring
        )
        try:
            router.open(exchange.context)
        except ValueError as exc:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, str(exc)) from None
        except OSError as exc:
            raise AMQPError(
                ReplyCode.RESOURCE_ERROR,
                f"cannot open the storage of exchange '{name}' in vhost '{self.name}': {exc}",
            ) from None
        return exchange

    def declare_exchange(
        self,
        name: str,
        type_name: str,
        *,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    ) -> Exchange:
        if name == "":
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange"
            )
        if passive:
            return self.get_exchange(name)
        if type_name not in self.exchange_types:
            raise AMQPError(
                ReplyCode.COMMAND_INVALID,
                f"unknown exchange type '{type_name}' (installed: "
                f"{', '.join(sorted(self.exchange_types))})",
            )
        existing = self.exchanges.get(name)
        if existing is not None:
            what = f"for exchange '{name}' in vhost '{self.name}'"
            self._check_equivalent(
                what,
                {
                    "type": (type_name, existing.type_name),
                    "durable": (durable, existing.durable),
                    "auto_delete": (auto_delete, existing.auto_delete),
                    "internal": (internal, existing.internal),
                },
                arguments,
                existing.arguments,
            )
            return existing
        if name.startswith("amq."):
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"exchange name '{name}' contains reserved prefix 'amq.*'",
            )
        exchange = self._new_exchange(
            name,
            type_name,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        self.exchanges[name] = exchange
        self._routing_changed()  # it may be another exchange's alternate
        if durable:
            self._on_change()
        return exchange

    @staticmethod
    def _check_equivalent(
        what: str,
        flags: dict[str, tuple[object, object]],
        arguments: FieldTable,
        current: FieldTable,
    ) -> None:
        for flag, (received, now) in flags.items():
            if received != now:
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"inequivalent arg '{flag}' {what}: received '{_fmt(received)}' but "
                    f"current is '{_fmt(now)}'",
                )
        for key in sorted(set(arguments) | set(current)):
            got: FieldValue = arguments.get(key)
            now_value: FieldValue = current.get(key)
            if encode_table({key: got}) != encode_table({key: now_value}):
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"inequivalent arg '{key}' {what}: received "
                    f"{'none' if got is None else repr(got)} but current is "
                    f"{'none' if now_value is None else repr(now_value)}",
                )

    def delete_exchange(self, name: str, *, if_unused: bool) -> None:
        if name == "" or name.startswith("amq."):
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"operation not permitted on exchange '{name}' (reserved name)",
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # deleting a missing exchange succeeds, as in RabbitMQ
        if if_unused and exchange.bindings:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use"
            )
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        for destination, key, args_id in list(exchange.bindings):
            exchange.unbind(destination, key, args_id)
            if isinstance(destination, Queue | Exchange):
                destination.bound_by.discard((exchange, key, args_id))
        for source, key, args_id in list(exchange.bound_by):
            source.unbind(exchange, key, args_id)
            self._maybe_auto_delete(source)
        exchange.bound_by.clear()
        if isinstance(exchange, HoldingExchange):
            exchange.holding_router.delete()  # its held messages go with it
        self._routing_changed()  # after the last change: whatever routed meanwhile is forgotten
        if exchange.durable:
            self._on_change()

    def _maybe_auto_delete(self, exchange: Exchange) -> None:
        if (
            exchange.auto_delete
            and exchange.had_binding
            and not exchange.bindings
            and self.exchanges.get(exchange.name) is exchange
        ):
            self._remove_exchange(exchange)

    def _source_for_binding(self, name: str) -> Exchange:
        if name == "":
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange"
            )
        return self.get_exchange(name)

    def bind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: FieldTable
    ) -> None:
        dest = self._source_for_binding(destination)
        src = self._source_for_binding(source)
        self._bind(src, dest, routing_key, arguments)

    def unbind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: FieldTable
    ) -> None:
        """Idempotent, as in RabbitMQ: unbinding from a missing exchange succeeds."""
        if "" in (destination, source):
            self._source_for_binding("")  # the default exchange is still refused (403)
        dest, src = self.exchanges.get(destination), self.exchanges.get(source)
        if dest is not None and src is not None:
            self._unbind(src, dest, routing_key, arguments)

    def _bind(
        self, source: Exchange, dest: Queue | Exchange, routing_key: str, arguments: FieldTable
    ) -> None:
        try:
            ref = source.bind(dest, routing_key, arguments)
        except ValueError as exc:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, str(exc)) from None
        if ref is not None:
            dest.bound_by.add(ref)
            self._routing_changed()
            if source.durable and dest.durable:
                self._on_change()

    def _unbind(
        self, source: Exchange, dest: Queue | Exchange, routing_key: str, arguments: FieldTable
    ) -> None:
        args_id = encode_table(arguments)
        if source.unbind(dest, routing_key, args_id):
            dest.bound_by.discard((source, routing_key, args_id))
            self._routing_changed()
            self._maybe_auto_delete(source)
            if source.durable and dest.durable:
                self._on_change()

    # -- durable definitions -----------------------------------------------------------------

    def definitions(self) -> dict[str, list[dict[str, Any]]]:
        """The durable exchanges, queues and bindings, for the definitions file."""
        exchanges = [
            {
                "name": x.name,
                "type": x.type_name,
                "auto_delete": x.auto_delete,
                "internal": x.internal,
                "arguments": x.arguments,
                # Where a holding exchange's store is (it reopens there after a restart).
                **(
                    {"store_backend": x.context.backend_name}
                    if isinstance(x, HoldingExchange) and x.context is not None
                    else {}
                ),
            }
            for x in self.exchanges.values()
            if x.durable and x.name and not x.name.startswith("amq.")
        ]
        queues = [
            {
                "name": q.name,
                "backend": q.backend_name,
                "auto_delete": q.auto_delete,
                "arguments": q.arguments,
            }
            for q in self.queues.values()
            if q.durable and q.exclusive_owner is None
        ]
        bindings = [
            {
                "source": source.name,
                "destination": dest.name,
                "destination_type": "queue" if isinstance(dest, Queue) else "exchange",
                "routing_key": key,
                "arguments": arguments,
            }
            for source in self.exchanges.values()
            if source.durable
            for (dest, key, _args_id), arguments in source.bindings.items()
            if isinstance(dest, Queue | Exchange)
            and dest.durable
            and not (isinstance(dest, Queue) and dest.exclusive_owner is not None)
        ]
        return {"exchanges": exchanges, "queues": queues, "bindings": bindings}

    def restore(self, definitions: Mapping[str, list[dict[str, Any]]]) -> None:
        """Recreate durable definitions saved by ``definitions`` (at startup)."""
        self._routing_changed()
        for x in definitions.get("exchanges", []):
            if x["type"] not in self.exchange_types:
                log.error(
                    "vhost %s: cannot restore exchange %r: no exchange type %r",
                    self.name,
                    x["name"],
                    x["type"],
                )
                continue
            try:
                self.exchanges[x["name"]] = self._new_exchange(
                    x["name"],
                    x["type"],
                    durable=True,
                    auto_delete=x["auto_delete"],
                    internal=x["internal"],
                    arguments=x["arguments"],
                    store_backend=x.get("store_backend"),
                    restoring=True,
                )
            except AMQPError as exc:  # e.g. what an exchange type needs is no longer installed
                log.error("vhost %s: cannot restore exchange %r: %s", self.name, x["name"], exc)
        for q in definitions.get("queues", []):
            self.create_queue(
                q["name"],
                q["backend"],
                durable=True,
                exclusive_owner=None,
                auto_delete=q["auto_delete"],
                arguments=q["arguments"],
            )
        for b in definitions.get("bindings", []):
            source = self.exchanges.get(b["source"])
            dest: Queue | Exchange | None = (
                self.queues.get(b["destination"])
                if b["destination_type"] == "queue"
                else self.exchanges.get(b["destination"])
            )
            if source is not None and dest is not None:
                ref = source.bind(dest, b["routing_key"], b["arguments"])
                if ref is not None:
                    dest.bound_by.add(ref)
        self._routing_changed()

    # -- queues ------------------------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        *,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: FieldTable,
        owner: object,
    ) -> Queue:
        if passive:
            return self.get_queue(name, owner)
        if name.startswith("amq."):
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"queue name '{name}' contains reserved prefix 'amq.*'",
            )
        if not name:
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        self._validate_queue_arguments(name, arguments)
        queue_type = arguments.get("x-queue-type", "classic")
        if queue_type not in ("classic", "stream"):
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg 'x-queue-type' for queue '{name}' in vhost '{self.name}': "
                f"{queue_type!r} is not supported (supported: 'classic', 'stream')",
            )
        if queue_type == "stream":
            self._check_stream(
                name,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=arguments,
            )
        existing = self.queues.get(name)
        if existing is not None:
            existing.touch()
            # RabbitMQ answers an exclusive mismatch with 405, before any other check.
            if existing.exclusive_owner is not (owner if exclusive else None):
                self._lock_error(existing)
            what = f"for queue '{name}' in vhost '{self.name}'"
            self._check_equivalent(
                what,
                {
                    "durable": (durable, existing.durable),
                    "auto_delete": (auto_delete, existing.auto_delete),
                },
                _equivalence_args(arguments),
                _equivalence_args(existing.arguments),
            )
            return existing
        backend_name = self._backend_for(
            name, durable=durable, exclusive=exclusive, arguments=arguments
        )
        backend = self.backends[backend_name]
        if backend.durable and not durable:
            for store_name in _store_names(name, arguments):  # a transient queue starts empty
                backend.delete_queue(self.name, store_name)
        queue = self.create_queue(
            name,
            backend_name,
            durable=durable,
            exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        if queue.durable:
            self._on_change()
        return queue

    def _validate_queue_arguments(self, name: str, arguments: FieldTable) -> None:
        """Refuse ill-typed or out-of-range ``x-`` arguments with RabbitMQ's 406."""
        for key, value in arguments.items():
            check = _ARGUMENT_CHECKS.get(key)
            problem = check(value) if check is not None else None
            if (
                problem is None
                and key == "x-dead-letter-routing-key"
                and "x-dead-letter-exchange" not in arguments
            ):
                problem = "x-dead-letter-routing-key set but x-dead-letter-exchange is not"
            if problem is not None:
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid arg '{key}' for queue '{name}' in vhost '{self.name}': "
                    f"{problem} (got {value!r})",
                )

    def _check_stream(
        self,
        name: str,
        *,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> None:
        """RabbitMQ's rules for stream queues: durable, not exclusive or auto-delete, none of
        the classic-only arguments; stored on the log backend."""
        for problem, present in (
            ("non-durable", not durable),
            ("exclusive", exclusive),
            ("auto-delete", auto_delete),
        ):
            if present:
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid property '{problem}' for queue '{name}' in vhost '{self.name}'",
                )
        for key in arguments:
            if key in _CLASSIC_ONLY_ARGS:
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid arg '{key}' for queue '{name}' in vhost '{self.name}': not "
                    "supported by stream queues",
                )
        if not hasattr(self.backends.get("log"), "open_stream"):
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"stream queue '{name}' in vhost '{self.name}' needs the log backend",
            )

    def _backend_for(
        self, name: str, *, durable: bool, exclusive: bool, arguments: FieldTable
    ) -> str:
        """Transient and exclusive queues live in memory, durable ones on the durable backend;
        the ``x-queue-backend`` argument overrides. Streams live on the log backend."""
        if arguments.get("x-queue-type") == "stream":
            return "log"
        chosen = arguments.get("x-queue-backend")
        if chosen is None:
            return self.durable_backend if durable and not exclusive else "memory"
        if not isinstance(chosen, str) or chosen not in self.backends:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg 'x-queue-backend' for queue '{name}' in vhost '{self.name}': "
                f"unknown backend {chosen!r} (installed: {', '.join(sorted(self.backends))})",
            )
        return chosen

    def create_queue(
        self,
        name: str,
        backend_name: str,
        *,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> Queue:
        """Create (or recover) a queue without the AMQP checks; starts its actor."""
        backend = self.backends[backend_name]
        queue: Queue
        try:
            if arguments.get("x-queue-type") == "stream":
                queue = StreamQueue(
                    self.name,
                    name,
                    self._open_stream(backend, name, arguments),
                    arguments=arguments,
                    flusher=self.flushers.get(backend_name),
                    groups=self.consumer_groups,
                )
            else:
                queue = ClassicQueue(
                    self.name,
                    name,
                    self._open_store(backend, name, arguments),
                    durable=durable,
                    exclusive_owner=exclusive_owner,
                    auto_delete=auto_delete,
                    arguments=arguments,
                    flusher=self.flushers.get(backend_name),
                )
        except OSError as exc:  # e.g. out of file descriptors or disk space
            raise AMQPError(
                ReplyCode.RESOURCE_ERROR,
                f"cannot open the storage of queue '{name}' in vhost '{self.name}': {exc}",
            ) from None
        queue.backend_name = backend_name
        queue.on_unused = self._remove_queue
        queue.dead_letter = self._dead_letter
        self.queues[name] = queue
        self._routing_changed()  # the default exchange (an alternate exchange, maybe) routes to it
        self._spawn(queue.run)
        return queue

    def _open_stream(self, backend: Backend, name: str, arguments: FieldTable) -> LogStream:
        assert isinstance(backend, LogBackend)
        segment_bytes = arguments.get("x-stream-max-segment-size-bytes")
        return backend.open_stream(
            self.name, name, segment_bytes=segment_bytes if isinstance(segment_bytes, int) else None
        )

    def _open_store(self, backend: Backend, name: str, arguments: FieldTable) -> QueueStore:
        """The queue's store: one backend store, or one per level for a priority queue."""
        names = _store_names(name, arguments)
        if len(names) == 1:
            return backend.open_queue(self.name, name)
        return PriorityStore([backend.open_queue(self.name, n) for n in names])

    def bind_queue(
        self, queue_name: str, exchange: str, routing_key: str, arguments: FieldTable, owner: object
    ) -> None:
        queue = self.get_queue(queue_name, owner)
        source = self._source_for_binding(exchange)
        self._bind(source, queue, routing_key, arguments)

    def unbind_queue(
        self, queue_name: str, exchange: str, routing_key: str, arguments: FieldTable, owner: object
    ) -> None:
        """Idempotent, as in RabbitMQ: unbinding a missing queue, from a missing exchange, or a
        binding that does not exist succeeds; exclusivity matters only for a real binding."""
        if exchange == "":
            self._source_for_binding(exchange)  # 403 on the default exchange
        queue, source = self.queues.get(queue_name), self.exchanges.get(exchange)
        if queue is None or source is None:
            return
        if (queue, routing_key, encode_table(arguments)) in source.bindings:
            self._check_exclusive(queue, owner)
            self._unbind(source, queue, routing_key, arguments)

    def purge_queue(self, name: str, owner: object) -> int:
        return self.get_queue(name, owner).purge()

    def delete_queue(self, name: str, *, if_unused: bool, if_empty: bool, owner: object) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0  # deleting a missing queue succeeds, as in RabbitMQ
        self._check_exclusive(queue, owner)
        if if_unused and queue.consumers:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' in use"
            )
        if if_empty and queue.message_count:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"queue '{name}' in vhost '{self.name}' is not empty",
            )
        count = queue.message_count
        self._remove_queue(queue)
        return count

    def _remove_queue(self, queue: Queue) -> None:
        if self.queues.get(queue.name) is not queue:
            return
        del self.queues[queue.name]
        queue.deleted = True
        for source, key, args_id in list(queue.bound_by):
            source.unbind(queue, key, args_id)
            self._maybe_auto_delete(source)
        queue.bound_by.clear()
        self._routing_changed()
        queue.cancel_consumers()
        queue.stop()
        for store_name in _store_names(queue.name, queue.arguments):
            self.backends[queue.backend_name].delete_queue(self.name, store_name)
        if queue.durable:
            self._on_change()

    def connection_closed(self, owner: object) -> None:
        """Delete the exclusive queues ``owner`` declared."""
        for queue in [q for q in self.queues.values() if q.exclusive_owner is owner]:
            self._remove_queue(queue)

    def _dead_letter(self, queue: Queue, message: Message, reason: Reason) -> None:
        """Route a message a queue dead-letters to its dead-letter exchange, as RabbitMQ does:
        with the queue's dead-letter routing key, else the message's own keys (and ``CC``);
        not to queues that would close a cycle without a rejection; at most once (no confirm
        waits on it, and a target that refuses it drops it)."""
        assert queue.dead_letter_exchange is not None
        exchange = self.exchanges.get(queue.dead_letter_exchange)
        if exchange is None:  # RabbitMQ drops it too
            log.debug(
                "queue %r: dead-letter exchange %r missing", queue.name, queue.dead_letter_exchange
            )
            return
        copy = dead_lettered(
            message,
            queue=queue.name,
            reason=reason,
            exchange=exchange.name,
            routing_key=queue.dead_letter_routing_key,
            now_ms=clock.now_ms(),
        )
        targets = []
        for target in self.route_keys(exchange, copy.routing_keys(), copy.properties):
            if is_cycle(copy, target.name):
                log.debug("dead-letter cycle through queue %r: message dropped", target.name)
            else:
                targets.append(target)
        self.enqueue(targets, copy)

    # -- routing -----------------------------------------------------------------------------

    def register_reply_consumer(self, consumer: ReplyConsumer) -> str:
        """Register a direct reply-to consumer; return the reply-to address to hand out."""
        address = REPLY_TO_PREFIX + base64.urlsafe_b64encode(os.urandom(18)).decode()
        self.reply_consumers[address] = consumer
        return address

    def unregister_reply_consumer(self, address: str) -> None:
        """Forget a direct reply-to address (its channel closed)."""
        self.reply_consumers.pop(address, None)

    def deliver_reply(self, routing_key: str, message: Message) -> bool:
        """Deliver a message published to a direct reply-to address; False if nobody waits."""
        consumer = self.reply_consumers.get(routing_key)
        if consumer is None:
            return False
        consumer.deliver_reply(message)
        return True

    def route_keys(
        self, exchange: Exchange, keys: Sequence[str], properties: BasicProperties
    ) -> Sequence[Destination]:
        """``route`` for each of ``keys`` (a routing key and its CC/BCC keys), each
        destination once. The result may be a memoised tuple shared with later calls: read it,
        never mutate it."""
        if len(keys) == 1:
            return self.route(exchange, keys[0], properties)
        found: dict[int, Destination] = {}
        for key in keys:
            for destination in self.route(exchange, key, properties):
                found[id(destination)] = destination
        return tuple(found.values())

    def _routing_changed(self) -> None:
        """Forget every memoised route: a binding, an exchange or a queue came or went (called
        by every change of routing state, before anything routes again)."""
        if self._route_memo:
            self._route_memo.clear()

    def enqueue(
        self, destinations: Iterable[Destination], message: Message
    ) -> tuple[list[tuple[Flusher, int]], bool]:
        """Hand a routed message to each destination; return the flusher tickets a publisher
        confirm waits for, and whether a destination refused it (full with reject-publish, or
        its storage cannot write: the publish is nacked; the others keep it)."""
        waits: list[tuple[Flusher, int]] = []
        refused = False
        for destination in destinations:
            if not destination.accepting:
                refused = True
                continue
            try:
                durability = destination.publish(message)
            except QueueFull:
                refused = True
                continue
            except OSError as exc:
                log.error("queue %r refused a message: %s", destination.name, exc)
                refused = True
                continue
            if durability is not None:
                waits.append(durability)
        return waits, refused

    def route(
        self, exchange: Exchange, routing_key: str, properties: BasicProperties
    ) -> tuple[Destination, ...]:
        """The queues a message reaches, each once, following exchange-to-exchange bindings and
        alternate exchanges; and the ``Destination`` objects of exchange types that hold
        messages (``plugins.spec``), which take the message to route it later.

        Memoised per (exchange, routing key) when every exchange whose router was asked is
        ``cacheable`` (then the properties played no part), until ``_routing_changed``."""
        if exchange is self.default_exchange:
            queue = self.queues.get(routing_key)
            return (queue,) if queue is not None else ()
        memo = self._route_memo
        if exchange.cacheable:
            memoised = memo.get((exchange, routing_key))
            if memoised is not None:
                return memoised
        cacheable = True
        queues: dict[int, Destination] = {}
        seen: set[Hashable] = {exchange}
        frontier = [exchange]
        while frontier:
            current = frontier.pop()
            if not current.cacheable:
                cacheable = False
            routed = False
            for dest in current.route(routing_key, properties):
                routed = True
                if isinstance(dest, Queue):
                    queues[id(dest)] = dest
                elif isinstance(dest, Exchange):
                    if dest not in seen:
                        seen.add(dest)
                        frontier.append(dest)
                else:  # an exchange type's own destination
                    queues[id(dest)] = cast(Destination, dest)
            if not routed and current.alternate is not None:
                alternate = self.exchanges.get(current.alternate)
                if alternate is not None and alternate not in seen:
                    seen.add(alternate)
                    frontier.append(alternate)
        found = tuple(queues.values())
        if cacheable:
            if len(memo) >= ROUTE_MEMO_SIZE:
                memo.clear()
            memo[(exchange, routing_key)] = found
        return found


def _int_range(low: int, high: int | None = None) -> Callable[[FieldValue], str | None]:
    def check(value: FieldValue) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return "an integer is required"
        if value < low or (high is not None and value > high):
            return f"must be between {low} and {high}" if high is not None else f"must be >= {low}"
        return None

    return check


def _one_of(*allowed: str) -> Callable[[FieldValue], str | None]:
    def check(value: FieldValue) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"

    return check


def _string(value: FieldValue) -> str | None:
    return None if isinstance(value, str) else "a string is required"


def _boolean(value: FieldValue) -> str | None:
    return None if isinstance(value, bool) else "a boolean is required"


def _interval(value: FieldValue) -> str | None:
    if isinstance(value, str) and parse_interval(value) is not None:
        return None
    return "an interval such as 7D or 12h is required (units Y M D h m s)"


# Type and range checks of the queue arguments RabbitMQ validates at declare time.
_ARGUMENT_CHECKS: Final[dict[str, Callable[[FieldValue], str | None]]] = {
    "x-expires": _int_range(1),
    "x-message-ttl": _int_range(0, 2**32 - 1),
    "x-max-length": _int_range(0),
    "x-max-length-bytes": _int_range(0),
    "x-max-priority": _int_range(0, 255),
    "x-delivery-limit": _int_range(0),
    "x-consumer-timeout": _int_range(0),
    "x-overflow": _one_of("drop-head", "reject-publish", "reject-publish-dlx"),
    "x-queue-mode": _one_of("default", "lazy"),
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    "x-single-active-consumer": _boolean,
    "x-max-age": _interval,
    # A segment keeps three files open: tiny segments would let one client exhaust the
    # broker's file descriptors, so 1 MiB is the least (RabbitMQ's default is 500 MB).
    "x-stream-max-segment-size-bytes": _int_range(1024 * 1024),
    # Compaction (Kafka's cleanup.policy=compact): the latest record per key is kept.
    "x-stream-cleanup-policy": _one_of("delete", "compact", "compact,delete", "delete,compact"),
    "x-stream-compaction-key-header": _string,
    "x-stream-delete-retention": _interval,
}

# Classic-queue arguments a stream refuses (RabbitMQ's feature matrix).
_CLASSIC_ONLY_ARGS: Final = frozenset(
    {
        "x-message-ttl",
        "x-expires",
        "x-max-length",
        "x-overflow",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-priority",
        "x-delivery-limit",
        "x-single-active-consumer",
        "x-queue-backend",
    }
)

# Queue arguments RabbitMQ compares on redeclare; others are accepted and ignored.
_EQUIVALENCE_ARGS: Final = frozenset(
    {
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-type",
        "x-single-active-consumer",
        "x-delivery-limit",
        "x-queue-backend",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-stream-cleanup-policy",
        "x-stream-compaction-key-header",
    }
)


def _store_names(queue: str, arguments: FieldTable) -> list[str]:
    """The backend stores of a queue: its name, plus one per level above 0 for a priority
    queue."""
    max_priority = arguments.get("x-max-priority")
    if isinstance(max_priority, int) and not isinstance(max_priority, bool) and max_priority > 0:
        return level_store_names(queue, max_priority)
    return [queue]


def _equivalence_args(arguments: FieldTable) -> FieldTable:
    return {k: v for k, v in arguments.items() if k in _EQUIVALENCE_ARGS}
