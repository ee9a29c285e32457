"""What an exchange-type plugin provides.

A plugin is an object registered under the entry-point group ``tqbroker.exchange_types``; the
entry point's name is the exchange type clients pass to ``exchange.declare``. The four built-in
types are registered the same way in tqbroker's own ``pyproject.toml``::

    [project.entry-points."tqbroker.exchange_types"]
    direct = "tqbroker.plugins.builtin.direct:DirectExchange"

The entry point names a class (instantiated with no arguments) or an instance.

An ``ExchangeType`` validates declare arguments and creates one ``Router`` per exchange. The broker
keeps the set of bindings itself (so ``bind``/``unbind`` are called once per distinct binding) and
asks the router where a message goes. Routers run on the broker's thread for every publish: keep
``route`` fast and never block.

A router whose result depends on nothing but the routing key and the exchange's bindings (not
the headers, the properties, the time, a counter or chance) may say so with a class or instance
attribute ``cacheable = True``, read once when its exchange is created: the broker then memoises
where each routing key goes through the exchange and asks the router again only after a change
to routing state (a binding, exchange or queue coming or going). Without the attribute (or with
``False``) the router is asked on every publish, which is always correct. The built-in direct,
fanout and topic routers are cacheable; headers is not; a ``HoldingRouter`` never is.

A router that routes on message properties other than headers (``x-consistent-hash``'s
``hash-property``) implements ``PropertyRouter``: the broker then calls
``route_message(routing_key, properties)`` instead of ``route``.

Exchange types that hold messages (delayed delivery, ``x-delayed-message``) use two optional
extensions; routers that do not need them (the built-in ones) are untouched and cost nothing:

- ``route`` may return, besides the queues and exchanges the broker bound, a ``Destination`` of
  the plugin's own: an object with ``publish(message) -> Durability`` and ``accepting``, the
  protocol queues implement. The broker hands it the message as it would a queue, and a publisher
  confirm waits for the ``Durability`` it returns (a ``GroupCommit`` ticket). Reaching only such
  destinations does not count as routed for ``mandatory``: the publisher gets ``basic.return``
  312 NO_ROUTE, as RabbitMQ's delayed-message exchange does; alternate exchanges are not used.
- A router with an ``open(context)`` method (``HoldingRouter``) receives an ``ExchangeContext``
  when its exchange comes into being (declared, or restored at startup), and ``delete()`` when the
  exchange is deleted. The context names the exchange, opens the exchange's own ``QueueStore`` on
  the broker's storage (the durable backend for a durable exchange, memory otherwise) and gives
  that backend's ``GroupCommit``, spawns supervised tasks in the broker's nursery, and routes a
  message through the exchange's bindings now (``publish``), which is how held messages leave.

``docs/plugins.md`` walks through writing such a type; ``plugins/delayed_message`` is one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from ..protocol.codec import FieldTable

if TYPE_CHECKING:
    from ..backends.base import QueueStore
    from ..model import Message
    from ..protocol.methods import BasicProperties


class FlushListener(Protocol):
    """Told when a ``GroupCommit``'s flushes complete or fail (``GroupCommit.listen``)."""

    def flushed(self, commit: GroupCommit) -> None:
        """Tickets up to ``commit.completed`` are durable."""
        ...

    def flush_failed(self, commit: GroupCommit, upto: int) -> None:
        """Tickets up to ``upto`` not yet completed will never be: refuse what waits on them."""
        ...


class GroupCommit(Protocol):
    """The group commit of one durable backend: many writes made durable by one flush.

    ``request()`` returns a ticket; once ``completed`` reaches it, everything written to the
    backend before the request is durable. All members are called on the broker's thread."""

    @property
    def completed(self) -> int:
        """The highest ticket known durable (or given up: see ``FlushListener.flush_failed``)."""
        ...

    @property
    def healthy(self) -> bool:
        """False while the backend cannot write (after a failed write or flush)."""
        ...

    def request(self) -> int:
        """A ticket for everything written so far; a flush runs soon."""
        ...

    def poke(self) -> None:
        """Run a flush soon (a store ``wants_flush``)."""
        ...

    def call_after_flush(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the next flush has finished (successfully or not)."""
        ...

    async def wait(self, ticket: int) -> bool:
        """Wait until ``ticket`` is durable (True) or its flush failed (False), for a caller
        that can wait (a task); on the broker's thread, listen instead."""
        ...

    def listen(self, listener: FlushListener) -> None:
        """Tell ``listener`` of every flush from now on."""
        ...

    def unlisten(self, listener: FlushListener) -> None: ...


# What a publish must wait for before it may be confirmed: a group-commit ticket, or nothing.
Durability: TypeAlias = "tuple[GroupCommit, int] | None"


class Router(Protocol):
    """The bindings of one exchange, indexed for routing.

    Optional, not part of the protocol's members (so that routers without it still match):
    ``cacheable: bool``, ``False`` when absent. ``True`` promises that ``route`` (or
    ``route_message``) returns the same destinations for the same routing key as long as no
    ``bind``/``unbind`` happens: the broker may then skip calling it (module docstring)."""

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        """Add a binding. Raise ``ValueError`` to refuse it (the client gets 406)."""
        ...

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        """Remove a binding previously added with the same values."""
        ...

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        """The destinations of a message (duplicates allowed; the broker de-duplicates): bound
        destinations, or ``Destination`` objects of the plugin's own."""
        ...


@runtime_checkable
class PropertyRouter(Router, Protocol):
    """A router that needs a message's properties (``message_id``, ``timestamp``...), not only
    its headers: the broker calls ``route_message`` instead of ``route``."""

    def route_message(self, routing_key: str, properties: BasicProperties) -> Iterable[Hashable]:
        """``route``, with the message's properties (``properties.headers`` are its headers)."""
        ...


@runtime_checkable
class ExchangeType(Protocol):
    """A routing algorithm."""

    def validate(self, arguments: FieldTable) -> None:
        """Check ``exchange.declare`` arguments; raise ``ValueError`` to refuse (406)."""
        ...

    def create_router(self, arguments: FieldTable) -> Router:
        """A router for a newly declared exchange."""
        ...


class Destination(Protocol):
    """Where a message can be put: a queue, or an object a router returns to take messages
    itself. Called on the broker's thread; never block."""

    name: str  # for diagnostics (a queue's name; a holding exchange's name)

    @property
    def accepting(self) -> bool:
        """False while the destination cannot store messages (its backend failed a write):
        publishes to it are refused (nacked) without calling ``publish``."""
        ...

    def publish(self, message: Message) -> Durability:
        """Take the message; return what its publisher confirm must wait for (``None``: confirm
        at once). Raise ``OSError`` when storage refuses it (the publish is nacked)."""
        ...


class ExchangeContext(Protocol):
    """What the broker gives a ``HoldingRouter``: its exchange, its storage, its nursery, and
    routing through the exchange's bindings."""

    @property
    def vhost(self) -> str: ...

    @property
    def exchange(self) -> str:
        """The exchange's name."""
        ...

    @property
    def durable(self) -> bool:
        """Whether the exchange is durable (survives a restart with its held messages)."""
        ...

    @property
    def exchange_types(self) -> Mapping[str, ExchangeType]:
        """Every exchange type the broker loaded, by name (to route like another type)."""
        ...

    def open_store(self) -> QueueStore:
        """The exchange's own message store, opened under a name no queue can have: on the
        broker's durable backend for a durable exchange, in memory otherwise. Empty when the
        exchange is newly declared; holding what a previous run left when it is restored at
        startup (messages pushed with ``persistent=True``, all ready). Raises ``OSError``."""
        ...

    @property
    def group_commit(self) -> GroupCommit | None:
        """The group commit of the store's backend (``None``: the store is in memory). After
        pushing a persistent message, ``(commit, commit.request())`` is the ``Durability`` to
        return; ``commit.healthy`` says whether it can write; ``commit.poke()`` when the store
        ``wants_flush``; ``commit.listen`` to hear of flushes."""
        ...

    def delete_store(self) -> None:
        """Remove the store and its messages for good."""
        ...

    def spawn(self, fn: Callable[[], Awaitable[object]]) -> None:
        """Start a task in the broker's nursery, under its supervisor. It is cancelled when the
        broker stops. An exception it raises is logged with its traceback and marks this
        exchange failed (publishes to it are refused with 541 INTERNAL_ERROR until it is
        deleted or the broker restarts); the rest of the broker keeps running."""
        ...

    def publish(self, message: Message) -> list[tuple[GroupCommit, int]]:
        """Route a message through the exchange's bindings as they are now (exchange-to-exchange
        bindings, alternate exchange and ``CC`` headers included) and enqueue it where it goes,
        as a publish to the exchange would, without ``mandatory`` or a confirm. Destinations that
        refuse it (full, storage failing) drop it (logged). Returns the group-commit tickets after
        which it is durable in the queues it reached; nothing if the exchange was deleted."""
        ...


@runtime_checkable
class HoldingRouter(Router, Protocol):
    """A router with a lifecycle, for exchange types that hold messages (optional methods)."""

    def open(self, context: ExchangeContext) -> None:
        """The exchange comes into being: declared, or restored at startup (then before its
        bindings are restored and before the broker accepts connections). Called once, before
        any ``bind`` or ``route``. Raise ``ValueError`` to refuse the declare (406); do that
        before opening the store."""
        ...

    def delete(self) -> None:
        """The exchange was deleted: stop its tasks and drop what it holds
        (``context.delete_store()``). Not called at broker shutdown (tasks are cancelled, stores
        closed with their backend)."""
        ...
