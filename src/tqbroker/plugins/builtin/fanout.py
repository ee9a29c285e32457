"""``fanout``: a message goes to every binding; keys are ignored."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from ...protocol.codec import FieldTable


class FanoutRouter:
    # The result depends only on the bindings: the vhost may memoise it.
    cacheable = True

    def __init__(self) -> None:
        self._destinations: Counter[Hashable] = Counter()

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        self._destinations[destination] += 1

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        self._destinations[destination] -= 1
        if self._destinations[destination] <= 0:
            del self._destinations[destination]

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        return self._destinations.keys()


class FanoutExchange:
    def validate(self, arguments: FieldTable) -> None:
        pass

    def create_router(self, arguments: FieldTable) -> FanoutRouter:
        return FanoutRouter()
