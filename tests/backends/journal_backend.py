"""A deliberately simple durable backend, for testing the conformance suite itself.

Not for production: every write appends one JSON line to a single journal that is never
compacted, and recovery replays all of it. It exists so that the durable half of
``tqbroker.testing.conformance`` (restarts, crashes, the flush protocol, the state machine's
restart rule) runs against something before the real durable backends plug in, and so that
broken variants can show the suite catches their bugs.

Records: ``push`` (persistent messages only, with their bytes and timestamp), ``id`` (a transient
push: only its id matters, so ids are never reused), ``deliver`` (a persistent message's first
delivery, written before ``pop`` returns it), ``ack`` (an ack or a purge of a persistent message)
and ``delete`` (a queue). Writes go to the page cache at once; ``begin_flush`` returns an ``fsync``.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tqbroker.model import Message

JOURNAL = "journal-backend.jsonl"


@dataclass
class _Entry:
    message: Message
    persistent: bool
    delivered: bool = False


@dataclass
class JournalQueueStore:
    backend: JournalBackend
    key: tuple[str, str]
    next_id: int = 1
    entries: dict[int, _Entry] = field(default_factory=dict)
    ready: list[int] = field(default_factory=list)  # heap of ids
    unacked: set[int] = field(default_factory=set)

    def push(self, message: Message, persistent: bool) -> int:
        message_id = self.next_id
        self.next_id += 1
        self.entries[message_id] = _Entry(message, persistent)
        heapq.heappush(self.ready, message_id)
        if persistent:
            self.backend.write(
                "push",
                self.key,
                message_id,
                message.exchange,
                message.routing_key,
                bytes(message.properties_raw).hex(),
                bytes(message.body).hex(),
                message.timestamp_ms,
            )
        else:
            self.backend.write("id", self.key, message_id, dirty=False)
        return message_id

    def peek(self) -> tuple[int, Message, bool] | None:
        if not self.ready:
            return None
        message_id = self.ready[0]
        entry = self.entries[message_id]
        return message_id, entry.message, entry.delivered

    def pop(self) -> tuple[int, Message, bool] | None:
        if not self.ready:
            return None
        message_id = heapq.heappop(self.ready)
        entry = self.entries[message_id]
        redelivered = entry.delivered
        if entry.persistent and not entry.delivered:
            self.backend.write("deliver", self.key, message_id)
        entry.delivered = True
        self.unacked.add(message_id)
        return message_id, entry.message, redelivered

    def ack(self, message_id: int) -> None:
        if message_id in self.unacked:
            self.unacked.discard(message_id)
            self._forget(message_id)

    def requeue(self, message_id: int) -> None:
        if message_id in self.unacked:
            self.unacked.discard(message_id)
            heapq.heappush(self.ready, message_id)

    def purge(self) -> int:
        dropped, self.ready = self.ready, []
        for message_id in dropped:
            self._forget(message_id)
        return len(dropped)

    def _forget(self, message_id: int) -> None:
        if self.entries.pop(message_id).persistent:
            self.backend.write("ack", self.key, message_id)

    @property
    def ready_count(self) -> int:
        return len(self.ready)

    @property
    def ready_bytes(self) -> int:
        return sum(len(self.entries[message_id].message.body) for message_id in self.ready)

    @property
    def unacked_count(self) -> int:
        return len(self.unacked)

    @property
    def wants_flush(self) -> bool:
        return False


class JournalBackend:
    name = "journal"
    durable = True

    def __init__(self) -> None:
        self._stores: dict[tuple[str, str], JournalQueueStore] = {}
        self._journal: IO[str] | None = None
        self._dirty = False

    @property
    def needs_flush(self) -> bool:
        return self._dirty

    @property
    def healthy(self) -> bool:
        return True

    def write(self, kind: str, key: tuple[str, str], *args: Any, dirty: bool = True) -> None:
        assert self._journal is not None
        self._journal.write(json.dumps([kind, *key, *args]) + "\n")
        self._journal.flush()  # into the page cache: survives the process, not the machine
        self._dirty = self._dirty or dirty

    def open(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / JOURNAL
        if path.exists():
            with path.open(encoding="utf-8") as journal:
                for line in journal:
                    self._replay(json.loads(line))
        for store in self._stores.values():
            store.ready = sorted(store.entries)
        self._journal = path.open("a", encoding="utf-8")

    def _replay(self, record: list[Any]) -> None:
        kind, vhost, queue, *args = record
        store = self._store((vhost, queue))
        if kind == "delete":
            store.entries.clear()
            return
        message_id = args[0]
        if kind == "push":
            exchange, routing_key, properties, body, timestamp_ms = args[1:]
            message = Message(
                exchange,
                routing_key,
                bytes.fromhex(properties),
                bytes.fromhex(body),
                timestamp_ms=timestamp_ms,
            )
            store.entries[message_id] = _Entry(message, True)
        elif kind == "deliver" and message_id in store.entries:
            store.entries[message_id].delivered = True
        elif kind == "ack":
            store.entries.pop(message_id, None)
        store.next_id = max(store.next_id, message_id + 1)

    def _store(self, key: tuple[str, str]) -> JournalQueueStore:
        if key not in self._stores:
            self._stores[key] = JournalQueueStore(self, key)
        return self._stores[key]

    def open_queue(self, vhost: str, queue: str) -> JournalQueueStore:
        return self._store((vhost, queue))

    def delete_queue(self, vhost: str, queue: str) -> None:
        store = self._stores.get((vhost, queue))
        if store is None or store.entries:
            self.write("delete", (vhost, queue))
        if store is not None:  # keep next_id: ids are never reused
            store.entries.clear()
            store.ready.clear()
            store.unacked.clear()

    def begin_flush(self) -> Callable[[], None] | None:
        if not self._dirty or self._journal is None:
            return None
        self._dirty = False
        fd = self._journal.fileno()
        return lambda: os.fsync(fd)

    def close(self) -> None:
        if self._journal is not None:
            os.fsync(self._journal.fileno())
            self._journal.close()
            self._journal = None
        self._stores.clear()
