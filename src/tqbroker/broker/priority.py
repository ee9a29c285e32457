"""Priority queues (``x-max-priority``), built the way RabbitMQ builds them: one backing store per
priority level, highest level served first.

Responsibilities:
- ``PriorityStore``: a ``QueueStore`` over one store per level (0..max) of any backend, so
  priorities work, and persist, on every backend; message ids carry their level;
- ``level_store_names``: the backend names of a queue's level stores (level 0 is the queue's own
  name, so a queue keeps its messages if its levels are ever read back by name).

A message's level is its ``priority`` property capped at the queue's maximum (absent: 0). Within a
level, order is the backend's (FIFO, requeued messages back in place).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ..backends.base import FLUSH_FIRST, FlushFirst, Popped, QueueStore
from ..model import Message
from ..protocol.methods import PRIORITY_FLAG

# Bit of the first property-flags byte that says ``priority`` is present.
_PRIORITY_FLAG: Final = PRIORITY_FLAG >> 8
# A character no client sends in a queue name in practice: it keeps level stores apart from
# user queues.
_LEVEL_SEPARATOR: Final = "\x00priority="


def level_store_names(queue: str, max_priority: int) -> list[str]:
    """The store names of levels 0..max_priority."""
    return [queue] + [f"{queue}{_LEVEL_SEPARATOR}{level}" for level in range(1, max_priority + 1)]


def message_priority(message: Message) -> int:
    """The ``priority`` property (0 when absent; decoded only when the flag says present)."""
    raw = message.properties_raw
    if not raw or not raw[0] & _PRIORITY_FLAG:
        return 0
    return message.properties.priority or 0


class PriorityStore:
    """One ``QueueStore`` per priority level behind the ``QueueStore`` interface. A message id
    is ``store_id * levels + level``."""

    def __init__(self, stores: Sequence[QueueStore]) -> None:
        self._stores = list(stores)
        self._levels = len(stores)

    def _split(self, message_id: int) -> tuple[QueueStore, int]:
        store_id, level = divmod(message_id, self._levels)
        return self._stores[level], store_id

    def _top(self) -> int | None:
        """The highest level with ready messages."""
        for level in range(self._levels - 1, -1, -1):
            if self._stores[level].ready_count:
                return level
        return None

    def push(self, message: Message, persistent: bool) -> int:
        level = min(message_priority(message), self._levels - 1)
        return self._stores[level].push(message, persistent) * self._levels + level

    def _take(self, peek: bool) -> Popped | FlushFirst | None:
        level = self._top()
        if level is None:
            return None
        store = self._stores[level]
        entry = store.peek() if peek else store.pop()
        if entry is None or entry is FLUSH_FIRST:  # FLUSH_FIRST: lower levels wait their turn
            return entry
        store_id, message, redelivered = entry
        return store_id * self._levels + level, message, redelivered

    def pop(self) -> Popped | FlushFirst | None:
        return self._take(peek=False)

    def peek(self) -> Popped | FlushFirst | None:
        return self._take(peek=True)

    def ack(self, message_id: int) -> None:
        store, store_id = self._split(message_id)
        store.ack(store_id)

    def requeue(self, message_id: int) -> None:
        store, store_id = self._split(message_id)
        store.requeue(store_id)

    def purge(self) -> int:
        return sum(store.purge() for store in self._stores)

    @property
    def ready_count(self) -> int:
        return sum(store.ready_count for store in self._stores)

    @property
    def ready_bytes(self) -> int:
        return sum(store.ready_bytes for store in self._stores)

    @property
    def unacked_count(self) -> int:
        return sum(store.unacked_count for store in self._stores)

    @property
    def wants_flush(self) -> bool:
        return any(store.wants_flush for store in self._stores)
