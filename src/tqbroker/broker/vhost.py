"""A virtual host: its exchanges, queues and bindings, and the AMQP rules for changing them.

Responsibilities:
- lookups, and declare / delete / bind / unbind for exchanges and queues with RabbitMQ's checks
  and reply codes (reserved ``amq.`` names 403, missing entities 404, exclusive queues 405,
  inequivalent redeclare 406, unknown exchange type 503); queue arguments are checked and typed
  (``QueueArguments``) here, once, by ``broker/arguments.py``'s rules;
- exclusive and auto-delete lifetimes;
- the ``QueueHost`` of its queues: dead-lettering (``deadletter.dead_letter``), deleting a queue
  nobody uses.

Routing and publishing are ``broker/routing.py``'s, direct reply-to ``broker/reply_to.py``'s,
durable definitions ``broker/definitions.py``'s, where messages are stored
``broker/storage.py``'s; exchange types make exchanges in ``broker/exchange_types.py``.
All on the broker's Trio thread; queue actors start through ``spawn`` (``Queue.begin``). A new
queue's stores are opened (recovered) in a worker thread by
``declaring.open_and_declare_queue`` (in memory: at once); a change to durable topology is told
to ``definitions`` (deferred after a backend flush for a store's delete).

Over 400 lines as one job: every change to the vhost's topology passes RabbitMQ's checks
here, in one place, so that AMQP, HTTP and definitions imports apply the same rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import NoReturn

import trio
import trio.lowlevel

from ..backends.base import Backend
from ..model import Message
from ..plugins.spec import ExchangeType
from ..protocol.codec import FieldTable, encode_table
from ..protocol.errors import AMQPError, ReplyCode
from .arguments import QueueArguments, check_equivalent
from .deadletter import Reason, dead_letter
from .declaring import check_queue_declare, empty_transient
from .definitions_file import TopologyChanges, Unwritten
from .dormant import Dormant
from .exchange import PREDECLARED, DefaultExchange, Exchange
from .exchange_types import new_exchange
from .flusher import Flusher
from .holding import HoldingExchange
from .pacing import Pacer, Slice
from .queue import Queue
from .queue_kinds import new_queue
from .read_budget import MIN_BUDGET, ReadBudget
from .reply_to import ReplyTo
from .routing import Routing
from .stats import MessageStats, StatsTotal, fold
from .storage import QueueStorage, storage_error
from .streams.groups import ConsumerGroups
from .streams.partition import StreamReplication
from .streams.queue import StreamQueue
from .supervisor import Spawn

log = logging.getLogger(__name__)

# Queues deleted between two yields of a long teardown (their actors end in the next round).
QUEUES_PER_SLICE = 100


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
        definitions: TopologyChanges | None = None,
        read_budget: ReadBudget | None = None,
    ) -> None:
        self.name = name
        self.exchange_types = exchange_types
        self.backends = backends
        self.flushers = flushers
        self.durable_backend = durable_backend
        self.storage = QueueStorage(name, backends, durable_backend)
        self.spawn = spawn  # starts a task in the broker's nursery
        # Told of changes to durable definitions (exchanges, queues, bindings).
        self.definitions = definitions or Unwritten()
        self._on_change = self.definitions.changed
        # The bytes its stream reads may hold: the broker's, shared by every vhost (a vhost
        # made alone has one of its own).
        self.read_budget = read_budget or ReadBudget(MIN_BUDGET)
        self.opening: dict[str, trio.Event] = {}  # queues whose stores open in a thread
        self.prepared_stores: set[str] = set()  # holding exchanges' (holding.open_holding_store)
        self.queues: dict[str, Queue] = {}
        # A cluster's replica roles, told of every stream partition here (None: one node).
        self.replication: StreamReplication | None = None
        # The vhost's message counters and rates (``broker/stats.py``).
        self.stats = StatsTotal()  # its connections' (and what the HTTP API counts)
        # Deleted queues' counters, by kind ("classic", "stream"): global totals never go back.
        self.deleted_queue_stats: dict[str, MessageStats] = {}
        self.dormant = Dormant(name)  # stored definitions kept but not running
        # Its ``max-queues`` limit, if any (the broker's ``limits.py`` answers).
        self.queue_limit: Callable[[], int | None] = lambda: None
        self.consumer_groups = ConsumerGroups(spawn, name)  # on streams (x-stream-group)
        self.default_exchange = DefaultExchange(name, self.queues)
        self.exchanges: dict[str, Exchange] = {"": self.default_exchange}
        # Direct reply-to: the channels consuming replies, by address.
        reply_to = ReplyTo()
        self.register_reply_consumer = reply_to.register
        self.unregister_reply_consumer = reply_to.unregister
        # Publishing: every publish, whoever makes it, goes through ``routing.publish``.
        self.routing = Routing(self.exchanges, self.queues, self.default_exchange, reply_to.deliver)
        # Where routing keys go, without publishing (for tools and tests).
        self.route = self.routing.route
        self.route_keys = self.routing.route_keys
        for name_, type_name in PREDECLARED:
            if type_name in exchange_types:
                self.exchanges[name_] = new_exchange(
                    self,
                    name_,
                    type_name,
                    durable=True,
                    auto_delete=False,
                    internal=False,
                    arguments={},
                )

    # -- lookups -----------------------------------------------------------------------------

    def _not_found(self, kind: str, name: str) -> AMQPError:
        return AMQPError(ReplyCode.NOT_FOUND, f"no {kind} '{name}' in vhost '{self.name}'")

    def get_exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            self.dormant.check_lookup("exchange", name)
            raise self._not_found("exchange", name)
        return exchange

    def get_queue(self, name: str, owner: object) -> Queue:
        """The queue, if it exists and ``owner`` (a connection) may use it."""
        queue = self.queues.get(name)
        if queue is None:
            self.dormant.check_lookup("queue", name)
            raise self._not_found("queue", name)
        self._check_exclusive(queue, owner)
        return queue

    def _check_exclusive(self, queue: Queue, owner: object) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not owner:
            self.lock_error(queue)

    def lock_error(self, queue: Queue) -> NoReturn:
        raise AMQPError(
            ReplyCode.RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{queue.name}' in vhost "
            f"'{self.name}'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.",
        )

    # -- exchanges ---------------------------------------------------------------------------

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
            raise AMQPError(ReplyCode.COMMAND_INVALID, f"unknown exchange type '{type_name}'")
        self.dormant.check_declare("exchange", name)
        existing = self.exchanges.get(name)
        if existing is not None:
            check_equivalent(
                f"for exchange '{name}' in vhost '{self.name}'",
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
        exchange = new_exchange(
            self,
            name,
            type_name,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        self.exchanges[name] = exchange
        self.routing.changed()  # it may be another exchange's alternate
        if durable:
            self._on_change()
        return exchange

    def delete_exchange(self, name: str, *, if_unused: bool) -> None:
        if name == "":
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange"
            )
        if name.startswith("amq."):
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed",
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            if self.dormant.remove("exchange", name) is not None:
                self._on_change()
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
        store_flusher = None
        if isinstance(exchange, HoldingExchange):
            exchange.holding_router.delete()  # its held messages go with it
            if exchange.context is not None:
                store_flusher = self.flushers.get(exchange.context.backend_name)
        self.routing.changed()  # after the last change: whatever routed meanwhile is forgotten
        if exchange.durable:
            # Written without it once its store's delete is durable.
            self.definitions.changed_after(store_flusher, definitions=True)

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
            self.routing.changed()
            if source.durable and dest.durable:
                self._on_change()

    def _unbind(
        self, source: Exchange, dest: Queue | Exchange, routing_key: str, arguments: FieldTable
    ) -> None:
        args_id = encode_table(arguments)
        if source.unbind(dest, routing_key, args_id):
            dest.bound_by.discard((source, routing_key, args_id))
            self.routing.changed()
            self._maybe_auto_delete(source)
            if source.durable and dest.durable:
                self._on_change()

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
        prepared: bool = False,
    ) -> Queue:
        """Declare a queue, opening a new one's stores here. ``prepared``: by
        ``declaring.open_and_declare_queue``, which named it and opened its stores in a thread."""
        found = check_queue_declare(
            self, name, passive, durable, exclusive, auto_delete, arguments, owner, prepared
        )
        if isinstance(found, Queue):
            return found
        if not prepared:
            empty_transient(self, *found, durable=durable)
        return self.create_declared(
            found, durable=durable, exclusive=exclusive, auto_delete=auto_delete, owner=owner
        )

    def create_declared(
        self,
        found: tuple[str, str, QueueArguments],
        *,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        owner: object,
    ) -> Queue:
        """Create the queue a declare's checks found to create (``check_queue_declare``: its
        name, backend and arguments), its stores open or opening at once."""
        name, backend_name, parsed = found
        queue = self.create_queue(
            name,
            backend_name,
            durable=durable,
            exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete,
            arguments=parsed,
        )
        if queue.durable:
            self._on_change()
        return queue

    def create_queue(
        self,
        name: str,
        backend_name: str,
        *,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: QueueArguments,
    ) -> Queue:
        """Create (or recover) a queue without the AMQP checks (``queue_kinds.new_queue``);
        starts its actor."""
        queue = new_queue(
            self,
            name,
            backend_name,
            durable=durable,
            exclusive_owner=exclusive_owner,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        self.queues[name] = queue
        if self.replication is not None and isinstance(queue, StreamQueue):
            self.replication.opened(self.name, name, queue.partition)  # gated before any use
        self.routing.changed()  # the default exchange (an alternate exchange, maybe) routes to it
        queue.begin(self.spawn)
        return queue

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
            dormant = self.dormant.remove("queue", name)
            if dormant is not None:
                arguments = QueueArguments.parse(dormant["arguments"])
                self.storage.delete_stores(dormant["backend"], name, arguments)
                flusher = self.flushers.get(dormant["backend"])
                self.definitions.changed_after(flusher, definitions=True)
            return 0  # deleting a missing queue succeeds, as in RabbitMQ
        self._check_exclusive(queue, owner)
        if if_unused and queue.consumers:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' in use"
            )
        if if_empty and queue.message_count:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"queue '{name}' in vhost '{self.name}' not empty",
            )
        count = queue.message_count
        try:
            self._remove_queue(queue)
        except OSError as exc:  # its storage stays, and so does the queue
            raise storage_error(exc, f"delete queue '{name}' in vhost '{self.name}'") from None
        return count

    def _remove_queue(self, queue: Queue) -> None:
        """Delete ``queue``: its storage first (``OSError``: nothing changed), then what the
        broker holds of it."""
        if self.queues.get(queue.name) is not queue:
            return
        self.storage.delete_stores(queue.backend_name, queue.name, queue.arguments)
        del self.queues[queue.name]
        queue.deleted = True
        if self.replication is not None and isinstance(queue, StreamQueue):
            self.replication.closed(self.name, queue.name)
        kind = "stream" if isinstance(queue, StreamQueue) else "classic"
        fold(self.deleted_queue_stats.setdefault(kind, MessageStats()), queue.stats)
        for source, key, args_id in list(queue.bound_by):
            source.unbind(queue, key, args_id)
            self._maybe_auto_delete(source)
        queue.bound_by.clear()
        self.routing.changed()
        queue.cancel_consumers()
        queue.stop()
        # The definitions lose it once its stores' delete is durable (never before: a crash
        # would leave its directory for a redeclare to find).
        flusher = self.flushers.get(queue.backend_name)
        self.definitions.changed_after(flusher, definitions=queue.durable)

    async def connection_closed(self, owner: object) -> None:
        """Delete the exclusive queues ``owner`` declared (giving way to other tasks now and
        then: there may be many)."""
        work = Slice()
        doomed: list[Queue] = []
        for queue in list(self.queues.values()):  # a pass over 100k queues: ~25 ms
            if queue.exclusive_owner is owner:
                doomed.append(queue)
            if work.used():
                await trio.lowlevel.checkpoint()
        doomed.reverse()
        pacer = Pacer(max_items=QUEUES_PER_SLICE)
        while doomed:
            # Popped, not iterated: the list would hold the last reference to every deleted
            # queue, and freeing 100k of them in one go when it is dropped took ~350 ms.
            self._remove_or_log(doomed.pop())
            await pacer.step()

    # -- as the queues' host (``QueueHost``) ---------------------------------------------------

    def dead_letter(self, queue: Queue, message: Message, reason: Reason) -> None:
        dead_letter(queue, message, reason, exchanges=self.exchanges, routing=self.routing)

    def queue_unused(self, queue: Queue) -> None:
        self._remove_or_log(queue)

    def _remove_or_log(self, queue: Queue) -> None:
        """Delete a queue no client waits on (auto-delete, exclusive): if storage refuses, it
        stays, logged."""
        try:
            self._remove_queue(queue)
        except OSError as exc:
            log.error("cannot delete queue %r in vhost %r: %s", queue.name, self.name, exc)
