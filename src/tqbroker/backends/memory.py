"""The in-memory backend: the reference implementation of the backend protocol.

Keeps messages in Python objects and survives nothing: a restart loses every message, which is
what transient queues promise. ``durable`` is false, nothing ever needs a flush, and it is always
healthy.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..model import Message


class MemoryQueueStore:
    """Ready messages in a deque (ids increasing) plus a heap of requeued ids, which are always
    older than anything in the deque, so ``pop`` takes the heap first."""

    def __init__(self) -> None:
        self._next_id = 1
        self._ready: deque[tuple[int, Message]] = deque()
        self._requeued: list[int] = []  # heap of ids
        self._messages: dict[int, Message] = {}  # unacked and requeued messages by id
        self._unacked: set[int] = set()
        self._ready_bytes = 0

    def push(self, message: Message, persistent: bool = False) -> int:
        message_id = self._next_id
        self._next_id += 1
        self._ready.append((message_id, message))
        self._ready_bytes += len(message.body)
        return message_id

    def peek(self) -> tuple[int, Message, bool] | None:
        if self._requeued:
            message_id = self._requeued[0]
            return message_id, self._messages[message_id], True
        if self._ready:
            message_id, message = self._ready[0]
            return message_id, message, False
        return None

    def pop(self) -> tuple[int, Message, bool] | None:
        if self._requeued:
            message_id = heapq.heappop(self._requeued)
            self._unacked.add(message_id)
            message = self._messages[message_id]
            self._ready_bytes -= len(message.body)
            return message_id, message, True
        if self._ready:
            message_id, message = self._ready.popleft()
            self._messages[message_id] = message
            self._unacked.add(message_id)
            self._ready_bytes -= len(message.body)
            return message_id, message, False
        return None

    def ack(self, message_id: int) -> None:
        if message_id in self._unacked:
            self._unacked.discard(message_id)
            del self._messages[message_id]

    def requeue(self, message_id: int) -> None:
        if message_id in self._unacked:
            self._unacked.discard(message_id)
            heapq.heappush(self._requeued, message_id)
            self._ready_bytes += len(self._messages[message_id].body)

    def purge(self) -> int:
        count = len(self._ready) + len(self._requeued)
        self._ready.clear()
        for message_id in self._requeued:
            del self._messages[message_id]
        self._requeued.clear()
        self._ready_bytes = 0
        return count

    @property
    def ready_count(self) -> int:
        return len(self._ready) + len(self._requeued)

    @property
    def ready_bytes(self) -> int:
        return self._ready_bytes

    @property
    def unacked_count(self) -> int:
        return len(self._unacked)

    wants_flush = False


class MemoryBackend:
    """Registered as the ``memory`` backend."""

    name = "memory"
    durable = False
    needs_flush = False
    healthy = True

    def __init__(self) -> None:
        self._stores: dict[tuple[str, str], MemoryQueueStore] = {}

    def open(self, data_dir: Path) -> None:
        pass

    def begin_flush(self) -> Callable[[], None] | None:
        return None

    def close(self) -> None:
        self._stores.clear()

    def open_queue(self, vhost: str, queue: str) -> MemoryQueueStore:
        return self._stores.setdefault((vhost, queue), MemoryQueueStore())

    def delete_queue(self, vhost: str, queue: str) -> None:
        self._stores.pop((vhost, queue), None)
