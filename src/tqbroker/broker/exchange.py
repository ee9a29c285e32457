"""Exchanges and their bindings.

Responsibilities:
- ``Exchange``: declared properties, the distinct bindings (source side), the plugin ``Router``
  that indexes them, and the exchanges/queues bound *to* it (``bound_by``) for clean deletes;
- whether routing through it may be memoised (``cacheable``: its router opted in);
- ``DefaultExchange``: the nameless direct exchange every queue is implicitly bound to by name
  (its router routes by queue name and takes no bindings).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping
from typing import Final, TypeAlias

from ..plugins.spec import HoldingRouter, PropertyRouter, Router
from ..protocol.codec import FieldTable, encode_table
from ..protocol.errors import AMQPError, ReplyCode
from ..protocol.methods import BasicProperties
from .plugin_errors import exchange_type_failed
from .stats import MessageStats

log = logging.getLogger(__name__)

# The exchanges every vhost has from the start (when their type is installed).
PREDECLARED: Final = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

# (source exchange, routing key, encoded arguments): how a destination remembers a binding to it.
BindingRef: TypeAlias = tuple["Exchange", str, bytes]


class Exchange:
    def __init__(
        self,
        name: str,
        type_name: str,
        router: Router,
        *,
        vhost: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    ) -> None:
        self.name = name
        self.type_name = type_name
        self.vhost = vhost
        self.router = router
        # Why the exchange failed (a task of its router raised); None while it works.
        self.failure: str | None = None
        self._property_router = router if isinstance(router, PropertyRouter) else None
        # The vhost may memoise where a routing key goes through this exchange (until routing
        # state changes) only if its router opted in (``cacheable = True``: the result depends on
        # nothing but the routing key and the bindings; plugins.spec). Never for a router that
        # holds messages. Read once: a router's promise does not change.
        self.cacheable = getattr(router, "cacheable", False) is True and not isinstance(
            router, HoldingRouter
        )
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments
        alternate = arguments.get("alternate-exchange")
        self.alternate = alternate if isinstance(alternate, str) else None
        # (destination, key, encoded args) -> args
        self.bindings: dict[tuple[Hashable, str, bytes], FieldTable] = {}
        self.bound_by: set[BindingRef] = set()
        self.had_binding = False
        # Message counters and rates for the management API and metrics (``broker/stats.py``).
        self.stats = MessageStats()

    def bind(self, destination: Hashable, key: str, arguments: FieldTable) -> BindingRef | None:
        """Add a binding; return the reference the destination keeps, or None if it existed."""
        args_id = encode_table(arguments)
        if (destination, key, args_id) in self.bindings:
            return None
        try:
            self.router.bind(destination, key, arguments)
        except ValueError:
            raise  # a refusal (406)
        except Exception as exc:
            raise self._plugin_failed("bind", exc) from exc
        self.bindings[(destination, key, args_id)] = arguments
        self.had_binding = True
        return (self, key, args_id)

    def unbind(self, destination: Hashable, key: str, args_id: bytes) -> bool:
        """Remove a binding; False if there was none."""
        arguments = self.bindings.pop((destination, key, args_id), None)
        if arguments is None:
            return False
        try:
            self.router.unbind(destination, key, arguments)
        except Exception as exc:
            raise self._plugin_failed("unbind", exc) from exc
        return True

    def route(self, routing_key: str, properties: BasicProperties) -> Iterable[Hashable]:
        """Where the router sends a message (541 naming the exchange type if it raises, or if
        the exchange failed)."""
        if self.failure is not None:
            raise AMQPError(
                ReplyCode.INTERNAL_ERROR,
                f"exchange '{self.name}' in vhost '{self.vhost}' failed ({self.failure}); "
                "delete it to recover",
                hard=False,
            )
        try:
            if self._property_router is not None:
                return self._property_router.route_message(routing_key, properties)
            return self.router.route(routing_key, properties.headers)
        except Exception as exc:
            raise self._plugin_failed("route", exc) from exc

    def fail(self, error: BaseException) -> None:
        """A task of the router failed: refuse publishes (541) until the exchange is deleted."""
        self.failure = f"{type(error).__name__}: {error}"

    def _plugin_failed(self, call: str, exc: Exception) -> AMQPError:
        return exchange_type_failed(
            exc, type_name=self.type_name, call=call, exchange=self.name, vhost=self.vhost
        )

    def __repr__(self) -> str:
        return f"Exchange({self.name!r}, {self.type_name!r})"


class DefaultExchange(Exchange):
    """The default exchange ``""``: routes to the queue named by the routing key.

    ``cacheable``: its result depends on the routing key and the set of queues, which is routing
    state (the vhost forgets memoised routes when a queue comes or goes). The vhost routes a
    publish to it directly, without the memo; it matters when it is an alternate exchange."""

    def __init__(self, vhost: str, queues: Mapping[str, Hashable]) -> None:
        super().__init__(
            "",
            "direct",
            _QueueByName(queues),
            vhost=vhost,
            durable=True,
            auto_delete=False,
            internal=False,
            arguments={},
        )
        self._queues = queues

    def route(self, routing_key: str, properties: BasicProperties) -> Iterable[Hashable]:
        queue = self._queues.get(routing_key)
        return (queue,) if queue is not None else ()


class _QueueByName:
    """The default exchange's router: the queue named by the routing key. Nothing binds to the
    default exchange (the vhost refuses it with 403 before asking)."""

    cacheable = True

    def __init__(self, queues: Mapping[str, Hashable]) -> None:
        self._queues = queues

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        raise ValueError("operation not permitted on the default exchange")

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        raise ValueError("operation not permitted on the default exchange")

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        queue = self._queues.get(routing_key)
        return (queue,) if queue is not None else ()
