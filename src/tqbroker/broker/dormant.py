"""Durable definitions the broker keeps but cannot run: dormant exchanges, queues and bindings.

A stored exchange whose type does not load, or a stored queue whose arguments no longer
validate, stops the start (``definitions.unrestorable``) unless the broker runs with
``keep_unloadable_definitions``: then it is kept here, exactly as stored, and written back
unchanged with the rest of the definitions, as are the bindings that name it. Clients meet its
name taken: a declare gets 406, a lookup 404, each saying why; a delete removes it for good (the
only way anything durable leaves the definitions file).
"""

from __future__ import annotations

from typing import Any

from ..protocol.errors import AMQPError, ReplyCode

Definition = dict[str, Any]


class Dormant:
    """The dormant definitions of one vhost."""

    def __init__(self, vhost: str) -> None:
        self.vhost = vhost
        self.exchanges: dict[str, tuple[Definition, str]] = {}  # name -> (as stored, why)
        self.queues: dict[str, tuple[Definition, str]] = {}
        self.bindings: list[Definition] = []

    def keep(self, kind: str, definition: Definition, why: str) -> None:
        table = self.exchanges if kind == "exchange" else self.queues
        table[definition["name"]] = (definition, why)

    def names(self, kind: str) -> dict[str, tuple[Definition, str]]:
        return self.exchanges if kind == "exchange" else self.queues

    def involves(self, binding: Definition) -> bool:
        """Whether a stored binding names a dormant exchange or queue."""
        dest = self.queues if binding["destination_type"] == "queue" else self.exchanges
        return binding["source"] in self.exchanges or binding["destination"] in dest

    def check_lookup(self, kind: str, name: str) -> None:
        """404 for a dormant name (a publish to it, a bind, a passive declare)."""
        found = self.names(kind).get(name)
        if found is not None:
            raise AMQPError(ReplyCode.NOT_FOUND, self._describe(kind, name, found[1]))

    def check_declare(self, kind: str, name: str) -> None:
        """406 for a declare of a dormant name."""
        found = self.names(kind).get(name)
        if found is not None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, self._describe(kind, name, found[1]))

    def remove(self, kind: str, name: str) -> Definition | None:
        """Delete a dormant exchange or queue and the bindings naming it; what it was, or None
        if the name is not dormant."""
        found = self.names(kind).pop(name, None)
        if found is None:
            return None
        self.bindings = [
            b
            for b in self.bindings
            if not (
                (kind == "exchange" and b["source"] == name)
                or (
                    b["destination"] == name
                    and (b["destination_type"] == "queue") == (kind == "queue")
                )
            )
        ]
        return found[0]

    def definitions(self) -> dict[str, list[Definition]]:
        return {
            "exchanges": [d for d, _ in self.exchanges.values()],
            "queues": [d for d, _ in self.queues.values()],
            "bindings": list(self.bindings),
        }

    def _describe(self, kind: str, name: str, why: str) -> str:
        return (
            f"{kind} '{name}' in vhost '{self.vhost}' is dormant ({why}); it is kept unchanged "
            "in the definitions: install what it needs and restart, or delete it"
        )
