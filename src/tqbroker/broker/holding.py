"""Exchanges whose exchange type holds messages (``plugins.spec.HoldingRouter``), and the
``ExchangeContext`` the broker gives their routers.

Responsibilities:
- ``HoldingExchange``: an ``Exchange`` that keeps its router's context (and so which backend its
  store lives on, for the definitions file);
- ``BrokerExchangeContext``: the exchange's own ``QueueStore`` under a reserved name (``amq.`` names
  cannot be declared as queues), its flusher, spawning into the broker's nursery, and routing a
  held message through the exchange's bindings now.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ..backends.base import QueueStore
from ..model import Message
from ..plugins.spec import Destination, ExchangeType, HoldingRouter
from ..protocol.codec import FieldTable
from .exchange import Exchange
from .flusher import Flusher
from .queue import QueueFull

if TYPE_CHECKING:
    from .vhost import VirtualHost

log = logging.getLogger("tqbroker.holding")

# A holding exchange's store is the queue store named STORE_PREFIX + exchange name: the vhost
# refuses to declare queues whose names start with "amq.", and server-named ones are "amq.gen-".
STORE_PREFIX: Final = "amq.exchange-store."


class HoldingExchange(Exchange):
    """An exchange whose router holds messages; ``context`` is set right after construction."""

    def __init__(
        self,
        name: str,
        type_name: str,
        router: HoldingRouter,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    ) -> None:
        super().__init__(
            name,
            type_name,
            router,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        self.holding_router = router
        self.context: BrokerExchangeContext | None = None


class BrokerExchangeContext:
    """The broker's ``plugins.spec.ExchangeContext``."""

    def __init__(
        self,
        vhost: VirtualHost,
        exchange: HoldingExchange,
        *,
        spawn: Callable[[Callable[[], Any]], None],
        store_backend: str | None,
        restoring: bool,
    ) -> None:
        self._vhost = vhost
        self._exchange = exchange
        self._spawn = spawn
        self._restoring = restoring
        # A restored exchange reopens its store where it was (the configured durable backend may
        # have changed since); a new one goes to the durable backend if durable, else memory.
        self.backend_name = store_backend or (
            vhost.durable_backend if exchange.durable else "memory"
        )
        self.store_name = STORE_PREFIX + exchange.name
        self._opened = False

    @property
    def vhost(self) -> str:
        return self._vhost.name

    @property
    def exchange(self) -> str:
        return self._exchange.name

    @property
    def durable(self) -> bool:
        return self._exchange.durable

    @property
    def exchange_types(self) -> Mapping[str, ExchangeType]:
        return self._vhost.exchange_types

    def open_store(self) -> QueueStore:
        backend = self._vhost.backends[self.backend_name]
        if not self._restoring and not self._opened and backend.durable:
            # A newly declared exchange starts empty, whatever an earlier one of that name left.
            backend.delete_queue(self._vhost.name, self.store_name)
        store = backend.open_queue(self._vhost.name, self.store_name)
        self._opened = True
        return store

    @property
    def flusher(self) -> Flusher | None:
        return self._vhost.flushers.get(self.backend_name)

    def delete_store(self) -> None:
        self._vhost.backends[self.backend_name].delete_queue(self._vhost.name, self.store_name)

    def spawn(self, fn: Callable[[], Awaitable[object]]) -> None:
        self._spawn(fn)

    def publish(self, message: Message) -> list[tuple[Flusher, int]]:
        vhost, exchange = self._vhost, self._exchange
        if vhost.exchanges.get(exchange.name) is not exchange:
            return []  # deleted meanwhile
        headers = message.properties.headers
        targets = vhost.route(exchange, message.routing_key, headers)
        cc = headers.get("CC") if headers else None
        if isinstance(cc, list):  # sender-selected distribution, as the channel routes it
            found: dict[int, Destination] = {id(t): t for t in targets}
            for key in cc:
                if isinstance(key, str):
                    found.update((id(t), t) for t in vhost.route(exchange, key, headers))
            targets = list(found.values())
        waits: list[tuple[Flusher, int]] = []
        for target in targets:
            if not target.accepting:
                log.warning(
                    "exchange %r in vhost %r: %r cannot store a message now; dropped there",
                    exchange.name,
                    vhost.name,
                    target.name,
                )
                continue
            try:
                durability = target.publish(message)
            except QueueFull:
                log.info(
                    "exchange %r: queue %r is full; message dropped there",
                    exchange.name,
                    target.name,
                )
                continue
            except OSError as exc:
                log.error(
                    "exchange %r: %r refused a message: %s; dropped there",
                    exchange.name,
                    target.name,
                    exc,
                )
                continue
            if durability is not None:
                waits.append(durability)
        return waits
