"""The storage contract between a queue and the place its messages live.

Responsibilities:
- ``QueueStore``: the messages of one queue, ready and unacknowledged, in order;
- ``Backend``: opens and deletes ``QueueStore``s and makes what was written durable when the
  broker's flusher asks; implementations register under the entry-point group
  ``tqbroker.backends`` (the built-in ``memory`` and ``log`` backends do, exactly as a third party
  would).

The contract is passive, like RabbitMQ's backing queue: a backend owns no tasks or timers. Every
method is called from the broker's Trio thread and must not block for long (a ``write`` into the
page cache is fine; an ``fsync`` is not). The one exception is the callable returned by
``Backend.begin_flush``, which the flusher runs in a worker thread while the Trio thread goes on
calling the other methods.

Messages: a store gives back what was pushed: exchange, routing key, the raw properties, the body
and ``timestamp_ms`` (a durable backend persists the timestamp too; message TTLs count from it).

Ordering: ``push`` assigns increasing message ids; ``pop`` returns ready messages in id order,
requeued messages first, so a message requeued with ``requeue`` goes back to its original place
ahead of newer ones. A durable backend keeps a message's id across restarts, and never reuses an
id within a queue.

Durability (backends whose ``durable`` is true):
- a message pushed with ``persistent=True`` is durable once a flush that *began* after the push
  has completed without raising; only then may the broker confirm it;
- transient messages (``persistent=False``) are never written durably and are gone after a
  restart, as RabbitMQ drops them from durable queues;
- acks, requeues and purges become durable lazily (at a later flush, or at ``close``); after a
  crash a message acked shortly before may come back, always flagged redelivered;
- after a restart (clean or not), every surviving message is ready, in id order; those that had
  been delivered (popped) before come back flagged redelivered. After a clean ``close``, messages
  never delivered come back unflagged; after a crash a backend may also flag a bounded window of
  messages past the last delivered one (it must flag every message that *may* have been
  delivered), never more.
A flush that raises means nothing since the previous successful flush may be assumed durable; the
backend reports ``healthy`` false until it can write again, and the broker refuses publishes
(nack) meanwhile.

The in-memory backend (``durable`` false) keeps nothing across a restart.

Opening: ``open_queue`` may block (recovery), so the broker calls it in a worker thread; a
backend whose stores open without touching the disk says so with a true ``opens_at_once``
attribute (optional; the memory backend's), and a declare then opens them on the Trio thread.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol, TypeAlias, runtime_checkable

from ..model import Message


class FlushFirst(enum.Enum):
    FLUSH_FIRST = enum.auto()


# What ``pop``/``peek`` return when messages are ready but the store must flush before it may
# hand out more (a durable backend's bounded delivery reservation; it then reports
# ``Backend.needs_flush``): run a flush and ask again.
FLUSH_FIRST: Final = FlushFirst.FLUSH_FIRST

# A message handed out: ``(id, message, redelivered)``.
Popped: TypeAlias = tuple[int, Message, bool]


class QueueStore(Protocol):
    """The messages of one queue."""

    def push(self, message: Message, persistent: bool) -> int:
        """Append a ready message; return its id (increasing per store). ``persistent`` asks
        for the message to survive a restart (ignored by non-durable backends)."""
        ...

    def pop(self) -> Popped | FlushFirst | None:
        """Take the oldest ready message as ``(id, message, redelivered)``; it becomes unacked.
        ``None`` when nothing is ready; ``FLUSH_FIRST`` when a durable backend must flush before
        it may hand out more (it then reports ``Backend.needs_flush``)."""
        ...

    def peek(self) -> Popped | FlushFirst | None:
        """What ``pop`` would return next, without taking it (the queue expires messages at
        its head by looking)."""
        ...

    def ack(self, message_id: int) -> None:
        """Forget an unacked message for good. Unknown ids are ignored."""
        ...

    def requeue(self, message_id: int) -> None:
        """Make an unacked message ready again, in its original position, marked redelivered.
        Unknown ids are ignored."""
        ...

    def purge(self) -> int:
        """Drop every ready message (unacked ones stay); return how many were dropped."""
        ...

    @property
    def ready_count(self) -> int:
        """Messages waiting for delivery."""
        ...

    @property
    def ready_bytes(self) -> int:
        """The body bytes of the messages waiting for delivery (``x-max-length-bytes``)."""
        ...

    @property
    def unacked_count(self) -> int:
        """Messages delivered and not yet acked."""
        ...

    @property
    def wants_flush(self) -> bool:
        """The store asks for a flush soon (e.g. to keep delivering without pausing); the
        broker then runs one. Unrelated to the durability of publishes."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A kind of storage. The broker creates one instance per backend name and calls ``open``
    once before anything else and ``close`` once at the end."""

    name: str
    durable: bool

    def open(self, data_dir: Path) -> None:
        """Start using ``data_dir`` (created if missing), recovering what a previous run left.

        A backend whose ``open`` also takes ``env: StorageEnv | None = None`` is given the
        broker's storage environment (None: the real file system): it does its durable file
        operations through it (``env.fs``, ``env.make_dirs``, ``env.atomic_write``,
        ``env.fsync_dir``), so that a simulated disk (a power-cut test's) sees them."""
        ...

    def open_queue(self, vhost: str, queue: str) -> QueueStore:
        """The store for a queue: created empty if new, recovered if it existed; the same
        store again while it is open. Blocking work: the broker may call it from a worker
        thread while the Trio thread uses the backend (appends, ``needs_flush``,
        ``begin_flush``), so guard what both touch (e.g. the registry of open stores, with a
        ``threading.Lock`` never held during recovery)."""
        ...

    def delete_queue(self, vhost: str, queue: str) -> None:
        """Remove the queue's messages for good: durably once the next flush has completed
        (the broker waits for that flush before it forgets the queue's definition, and before
        it answers the client). May be called from a worker thread, as ``open_queue``."""
        ...

    @property
    def needs_flush(self) -> bool:
        """True when something written since the last flush awaits durability."""
        ...

    @property
    def healthy(self) -> bool:
        """False after a failed write or flush, until a flush succeeds again."""
        ...

    def begin_flush(self) -> Callable[[], None] | None:
        """Snapshot what must be made durable and return the blocking work that does it (run in
        a worker thread; it raises ``OSError`` on failure), or ``None`` if nothing is pending."""
        ...

    def close(self) -> None:
        """Clean shutdown: make everything durable and mark the data as cleanly closed."""
        ...
