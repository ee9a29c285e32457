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
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Protocol, runtime_checkable

from ..protocol.codec import FieldTable


class Router(Protocol):
    """The bindings of one exchange, indexed for routing."""

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        """Add a binding. Raise ``ValueError`` to refuse it (the client gets 406)."""
        ...

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        """Remove a binding previously added with the same values."""
        ...

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        """The destinations of a message (duplicates allowed; the broker de-duplicates)."""
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
