"""Exchanges whose exchange type holds messages (``plugins.spec.HoldingRouter``), and the
``ExchangeContext`` the broker gives their routers.

Responsibilities:
- ``HoldingExchange``: an ``Exchange`` that keeps its router's context (and so which backend its
  store lives on, for the definitions file);
- ``BrokerExchangeContext``: the exchange's own ``QueueStore`` under a reserved name (``amq.`` names
  cannot be declared as queues), its group commit, spawning into the broker's nursery, and
  publishing a held message through the exchange's bindings now (``Routing.publish``, as the
  broker republishes: uncounted);
- ``open_holding_store``: a new durable holding exchange's store, emptied and opened in a worker
  thread before the declare creates the exchange (which then finds it open).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final, cast

import trio

from ..backends.base import QueueStore
from ..model import Message
from ..plugins.spec import ExchangeType, GroupCommit, HoldingRouter
from ..protocol.codec import FieldTable
from .exchange import Exchange
from .supervisor import Spawn

if TYPE_CHECKING:
    from .vhost import VirtualHost

log = logging.getLogger(__name__)

# A holding exchange's store is the queue store named STORE_PREFIX + exchange name: the vhost
# refuses to declare queues whose names start with "amq.", and server-named ones are "amq.gen-".
STORE_PREFIX: Final = "amq.exchange-store."


class HoldingExchange(Exchange):
    """An exchange whose router holds messages; ``context`` is set right after construction."""

    context: BrokerExchangeContext | None = None

    @property
    def holding_router(self) -> HoldingRouter:
        return cast(HoldingRouter, self.router)


class BrokerExchangeContext:
    """The broker's ``plugins.spec.ExchangeContext``."""

    def __init__(
        self,
        vhost: VirtualHost,
        exchange: HoldingExchange,
        *,
        spawn: Spawn,
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
        prepared = self.store_name in self._vhost.prepared_stores  # by open_holding_store
        self._vhost.prepared_stores.discard(self.store_name)
        if not self._restoring and not self._opened and backend.durable and not prepared:
            # A newly declared exchange starts empty, whatever an earlier one of that name left.
            backend.delete_queue(self._vhost.name, self.store_name)
            flusher = self._vhost.flushers.get(self.backend_name)
            self._vhost.definitions.changed_after(flusher, definitions=False)
        store = backend.open_queue(self._vhost.name, self.store_name)
        self._opened = True
        return store

    @property
    def group_commit(self) -> GroupCommit | None:
        return self._vhost.flushers.get(self.backend_name)

    def delete_store(self) -> None:
        self._vhost.backends[self.backend_name].delete_queue(self._vhost.name, self.store_name)

    def spawn(self, fn: Callable[[], Awaitable[object]]) -> None:
        self._spawn(fn, on_failure=self._failed)

    def _failed(self, error: BaseException) -> None:
        """A task of the exchange's router failed: the exchange refuses publishes from now on."""
        self._exchange.fail(error)
        self._vhost.routing.changed()

    def publish(self, message: Message) -> list[tuple[GroupCommit, int]]:
        vhost, exchange = self._vhost, self._exchange
        if vhost.exchanges.get(exchange.name) is not exchange:
            return []  # deleted meanwhile
        waits, refused, _, _ = vhost.routing.publish(exchange, message)
        if refused:
            log.info("exchange %r: a destination refused a held message", exchange.name)
        return waits


async def open_holding_store(
    vhost: VirtualHost, name: str, type_name: str, *, durable: bool, arguments: FieldTable
) -> None:
    """Before a durable exchange ``name`` is declared: if it is new and its type holds
    messages, empty its store (as a new exchange's starts) and open it in a worker thread.
    Anything this cannot tell is left to the declare, which opens the store itself."""
    exchange_type = vhost.exchange_types.get(type_name)
    backend = vhost.backends[vhost.durable_backend]
    if not (durable and backend.durable and name) or exchange_type is None:
        return
    if name in vhost.exchanges or name.startswith("amq."):
        return
    try:
        exchange_type.validate(arguments)
        holds = isinstance(exchange_type.create_router(arguments), HoldingRouter)
    except Exception:  # the declare refuses it, and says why
        return
    if not holds:
        return
    store_name = STORE_PREFIX + name
    backend.delete_queue(vhost.name, store_name)
    vhost.definitions.changed_after(vhost.flushers.get(vhost.durable_backend), definitions=False)
    await trio.to_thread.run_sync(backend.open_queue, vhost.name, store_name)
    vhost.prepared_stores.add(store_name)
