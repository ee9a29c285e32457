"""The in-memory backend: the reference implementation of the backend protocol.

Keeps messages in Python objects and survives nothing: a restart loses every message, which is
what transient queues promise. ``durable`` is false, nothing ever needs a flush, and it is always
healthy.

Memory stays bounded however long a queue grows: past ``window`` ready messages in memory
(``PAGE_WINDOW``, 100k; the broker lowers it when memory runs short, ``set_window``), further
messages are paged out to disk (``paging.PageFile``, under ``memory-pages`` in the data
directory, wiped at start) and read back in batches as the front of the queue drains, in order.
A paged-out message costs no memory.
"""

from __future__ import annotations

import heapq
import shutil
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ..model import Message
from ..storage_env import StorageEnv
from .paging import PageFile

PAGE_WINDOW: Final = 100_000  # ready messages a queue keeps in memory before paging out
REFILL: Final = 1024  # messages read back at a time
PAGES_DIR: Final = "memory-pages"


class Paging:
    """Where queues page out to, and how many ready messages each keeps in memory."""

    def __init__(self) -> None:
        self.directory: Path | None = None  # None: never page out (no data directory)
        self.window = PAGE_WINDOW  # the backend's ``page_window``, lowered under pressure


class MemoryQueueStore:
    """Ready messages in a deque plus a heap of requeued ids, which are always older than
    anything in the deque, so ``pop`` takes the heap first.

    The deque holds the messages alone (no per-message id or tuple: 88 B less per queued
    message): their ids are consecutive, ``_head_id`` upwards, since every message pushed
    after the first paged-out one is paged out too and comes back in order."""

    def __init__(self, paging: Paging | None = None) -> None:
        self._next_id = 1
        self._paging = paging or Paging()
        self._pages: PageFile | None = None  # the paged-out tail of the ready messages
        self._ready: deque[Message] = deque()
        self._head_id = 1  # the id of ``_ready[0]``
        self._requeued: list[int] = []  # heap of ids
        self._messages: dict[int, Message] = {}  # unacked and requeued messages by id
        self._unacked: set[int] = set()
        self._ready_bytes = 0

    def push(self, message: Message, persistent: bool = False) -> int:
        message_id = self._next_id
        pages = self._pages
        if pages is not None and pages.count:  # behind paged-out messages: paged out too
            pages.append(message_id, message)
        elif len(self._ready) >= self._paging.window and self._paging.directory is not None:
            if pages is None:
                pages = self._pages = PageFile(self._paging.directory)
            pages.append(message_id, message)  # OSError: refused, nothing changed
        else:
            if not self._ready:
                self._head_id = message_id
            self._ready.append(message)
        self._next_id += 1
        self._ready_bytes += len(message.body)
        return message_id

    def _refill(self) -> bool:
        """Read paged-out messages back once the ones in memory ran out."""
        pages = self._pages
        if pages is None or not pages.count:
            return False
        taken = pages.take(REFILL)
        if taken:
            if not self._ready:
                self._head_id = taken[0][0]
            self._ready.extend(message for _id, message in taken)
        return True

    def close(self) -> None:
        """Remove the paged-out messages' files."""
        if self._pages is not None:
            self._pages.clear()

    def peek(self) -> tuple[int, Message, bool] | None:
        if self._requeued:
            message_id = self._requeued[0]
            return message_id, self._messages[message_id], True
        if self._ready or self._refill():
            return self._head_id, self._ready[0], False
        return None

    def pop(self) -> tuple[int, Message, bool] | None:
        if self._requeued:
            message_id = heapq.heappop(self._requeued)
            self._unacked.add(message_id)
            message = self._messages[message_id]
            self._ready_bytes -= len(message.body)
            return message_id, message, True
        if self._ready or self._refill():
            message_id = self._head_id
            self._head_id += 1
            message = self._ready.popleft()
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
        count = self.ready_count
        self._ready.clear()
        self.close()
        for message_id in self._requeued:
            del self._messages[message_id]
        self._requeued.clear()
        self._ready_bytes = 0
        return count

    @property
    def ready_count(self) -> int:
        paged = self._pages.count if self._pages is not None else 0
        return len(self._ready) + len(self._requeued) + paged

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
    opens_at_once = True  # ``open_queue`` touches no file: a declare calls it on the loop

    def __init__(self, page_window: int = PAGE_WINDOW) -> None:
        self._stores: dict[tuple[str, str], MemoryQueueStore] = {}
        self.paging = Paging()
        self.page_window = self.paging.window = page_window  # as configured

    def open(self, data_dir: Path, env: StorageEnv | None = None) -> None:
        # Pages are scratch files, thrown away at every start: not through ``env``.
        directory = data_dir / PAGES_DIR
        shutil.rmtree(directory, ignore_errors=True)  # what a previous run paged out
        self.paging.directory = directory

    def set_window(self, window: int) -> None:
        """Ready messages each queue keeps in memory before paging out (the broker lowers it
        when memory runs short); applies to messages published from now on."""
        self.paging.window = window

    def begin_flush(self) -> Callable[[], None] | None:
        return None

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()

    def open_queue(self, vhost: str, queue: str) -> MemoryQueueStore:
        store = self._stores.get((vhost, queue))
        if store is None:
            store = self._stores[vhost, queue] = MemoryQueueStore(self.paging)
        return store

    def delete_queue(self, vhost: str, queue: str) -> None:
        store = self._stores.pop((vhost, queue), None)
        if store is not None:
            store.close()
