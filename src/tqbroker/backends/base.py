"""The storage contract between a queue and the place its messages live.

Responsibilities:
- ``QueueStore``: the messages of one queue, ready and unacknowledged, in order;
- ``Backend``: opens and deletes ``QueueStore``s; implementations register under the
  entry-point group ``tqbroker.backends`` (the built-in ``memory`` backend does, exactly as a
  third party would).

The contract is passive, like RabbitMQ's backing queue: a store owns no tasks or timers and never
blocks; the queue actor calls it from the Trio thread.

Ordering: ``push`` assigns increasing message ids; ``pop`` returns ready messages in id order, so a
message requeued with ``requeue`` goes back to its original place ahead of newer messages.
Durability: the in-memory backend keeps nothing across a restart.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..model import Message


class QueueStore(Protocol):
    """The messages of one queue."""

    def push(self, message: Message) -> int:
        """Append a ready message; return its id (increasing per store)."""
        ...

    def pop(self) -> tuple[int, Message, bool] | None:
        """Take the oldest ready message as ``(id, message, redelivered)``; it becomes unacked.
        ``None`` when nothing is ready."""
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
    def unacked_count(self) -> int:
        """Messages delivered and not yet acked."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A kind of storage; one instance per broker."""

    name: str

    def open_queue(self, vhost: str, queue: str) -> QueueStore:
        """The store for a queue (created empty if new)."""
        ...

    def delete_queue(self, vhost: str, queue: str) -> None:
        """Remove the queue's messages for good."""
        ...
