"""When a produce's records are durable: ``Durability`` follows the group commits their
appends got tickets from, by each commit's first and last ticket, rather than one wait per
record (a 500k-record batch would hold the event loop that long)."""

from __future__ import annotations

import trio

from ...plugins.spec import GroupCommit


class Durability:
    """When every record of a produce is durable, by each group commit's first and last ticket
    (rather than one wait per record: a 500k-record batch would hold the event loop that long).
    It listens from the first ticket on, so a flush that fails any record is seen even when a
    later flush succeeds (``FlushListener``)."""

    def __init__(self) -> None:
        self._first: dict[GroupCommit, int] = {}
        self._last: dict[GroupCommit, int] = {}
        self._failed = False
        self._changed = trio.Event()

    def __enter__(self) -> Durability:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for commit in self._first:
            commit.unlisten(self)

    def add(self, tickets: list[tuple[GroupCommit, int]]) -> None:
        for commit, ticket in tickets:
            if commit not in self._first:
                self._first[commit] = ticket
                commit.listen(self)
            self._last[commit] = ticket

    def flushed(self, commit: GroupCommit) -> None:
        self._changed.set()

    def flush_failed(self, commit: GroupCommit, upto: int) -> None:
        # Tickets in (commit.completed, upto] failed (``completed`` is not yet moved on).
        first = self._first.get(commit)
        if first is not None and first <= upto and self._last[commit] > commit.completed:
            self._failed = True
        self._changed.set()

    async def wait(self) -> bool:
        """Until each commit's last ticket is durable (True) or a flush failed one (False)."""
        while not self._failed and any(c.completed < t for c, t in self._last.items()):
            await self._changed.wait()
            self._changed = trio.Event()
        return not self._failed
