"""``headers``: route on message headers instead of the routing key.

A binding's arguments hold the headers to match and ``x-match``: ``all`` (default) or ``any``
compare every argument not starting with ``x-``; ``all-with-x`` / ``any-with-x`` compare those
too. An argument whose value is void (``None``) matches on the header's presence alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable

from ...protocol.codec import FieldTable, FieldValue

_MODES = {"all", "any", "all-with-x", "any-with-x"}
_ABSENT = object()


def _matches(mode: str, wanted: list[tuple[str, FieldValue]], headers: FieldTable) -> bool:
    def one(name: str, value: FieldValue) -> bool:
        got = headers.get(name, _ABSENT)
        if got is _ABSENT:
            return False
        return value is None or (got == value and type(got) is type(value))

    if mode.startswith("all"):
        return all(one(name, value) for name, value in wanted)
    return any(one(name, value) for name, value in wanted)


class HeadersRouter:
    # Routes on each message's headers: the vhost must ask every time.
    cacheable = False

    def __init__(self) -> None:
        self._bindings: list[tuple[Hashable, str, list[tuple[str, FieldValue]]]] = []

    @staticmethod
    def _parse(arguments: FieldTable) -> tuple[str, list[tuple[str, FieldValue]]]:
        mode = arguments.get("x-match", "all")
        if mode not in _MODES:
            # RabbitMQ 3.10's words, a string shown as Erlang prints a binary.
            shown = repr(mode)
            if isinstance(mode, str):
                shown = '<<"' + mode.replace("\\", "\\\\").replace('"', '\\"') + '">>'
            raise ValueError(
                f"Invalid x-match field value {shown}; expected all, any, all-with-x, or any-with-x"
            )
        assert isinstance(mode, str)
        with_x = mode.endswith("-with-x")
        wanted = [
            (name, value)
            for name, value in arguments.items()
            if name != "x-match" and (with_x or not name.startswith("x-"))
        ]
        return mode, wanted

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        mode, wanted = self._parse(arguments)
        self._bindings.append((destination, mode, wanted))

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        mode, wanted = self._parse(arguments)
        with contextlib.suppress(ValueError):
            self._bindings.remove((destination, mode, wanted))

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        headers = headers or {}
        return [dest for dest, mode, wanted in self._bindings if _matches(mode, wanted, headers)]


class HeadersExchange:
    def validate(self, arguments: FieldTable) -> None:
        pass

    def create_router(self, arguments: FieldTable) -> HeadersRouter:
        return HeadersRouter()
