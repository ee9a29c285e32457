"""``direct``: a message goes to the bindings whose key equals its routing key."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from ...protocol.codec import FieldTable


class DirectRouter:
    # The result depends only on the routing key and the bindings: the vhost may memoise it.
    cacheable = True

    def __init__(self) -> None:
        self._by_key: dict[str, Counter[Hashable]] = {}

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        self._by_key.setdefault(binding_key, Counter())[destination] += 1

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        dests = self._by_key.get(binding_key)
        if dests is None:
            return
        dests[destination] -= 1
        if dests[destination] <= 0:
            del dests[destination]
        if not dests:
            del self._by_key[binding_key]

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        return self._by_key.get(routing_key, ())


class DirectExchange:
    def validate(self, arguments: FieldTable) -> None:
        pass

    def create_router(self, arguments: FieldTable) -> DirectRouter:
        return DirectRouter()
