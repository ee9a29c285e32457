"""Where a vhost's queues keep their messages.

Responsibilities:
- the backend of a new queue: transient and exclusive queues in memory, durable ones on the
  durable backend, ``x-queue-backend`` overriding; streams on a backend that can hold them
  (``StreamBackend``): the one ``x-queue-backend`` names, else the durable backend if it can,
  else the first installed one that can (the built-in ``log`` backend does);
- the stores behind a queue: one backend store, or one per priority level for an
  ``x-max-priority`` queue (``PriorityStore``); a stream's log; opening and deleting them
  (``open``, which recovers them, may run in a worker thread; not for a backend that
  ``opens_at_once``, as the memory backend).
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator, Mapping
from typing import Final

from ..backends.base import Backend, QueueStore
from ..backends.streams import StreamBackend, StreamLog
from ..protocol.errors import AMQPError, ReplyCode
from .arguments import STREAM, QueueArguments
from .plugin_errors import backend_failed
from .priority import PriorityStore, level_store_names

log = logging.getLogger(__name__)


class QueueStorage:
    """The backends of one vhost, as its queues use them."""

    def __init__(self, vhost: str, backends: Mapping[str, Backend], durable_backend: str) -> None:
        self.vhost = vhost
        self.backends = backends
        self.durable_backend = durable_backend

    def stream_backend(self, name: str, arguments: QueueArguments) -> str:
        """The backend a stream queue lives on (406 when no installed backend holds streams,
        or when ``x-queue-backend`` names one that does not)."""
        chosen = arguments.backend
        if chosen is not None:
            if isinstance(chosen, str) and isinstance(self.backends.get(chosen), StreamBackend):
                return chosen
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg 'x-queue-backend' for queue '{name}' in vhost '{self.vhost}': "
                f"backend {chosen!r} cannot hold streams",
            )
        capable = [n for n, b in self.backends.items() if isinstance(b, StreamBackend)]
        if self.durable_backend in capable:
            return self.durable_backend
        if not capable:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"stream queue '{name}' in vhost '{self.vhost}' needs a storage backend that "
                "holds streams (such as log)",
            )
        return "log" if "log" in capable else capable[0]

    def backend_for(
        self, name: str, *, durable: bool, exclusive: bool, arguments: QueueArguments
    ) -> str:
        """Transient and exclusive queues live in memory, durable ones on the durable backend;
        the ``x-queue-backend`` argument overrides. Streams: ``stream_backend``."""
        if arguments.kind == STREAM:
            return self.stream_backend(name, arguments)
        chosen = arguments.backend
        if chosen is None:
            return self.durable_backend if durable and not exclusive else "memory"
        if not isinstance(chosen, str) or chosen not in self.backends:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg 'x-queue-backend' for queue '{name}' in vhost '{self.vhost}': "
                f"unknown backend {chosen!r} (installed: {', '.join(sorted(self.backends))})",
            )
        return chosen

    def open_stream(self, backend_name: str, name: str, arguments: QueueArguments) -> StreamLog:
        backend = self.backends[backend_name]
        if not isinstance(backend, StreamBackend):  # stream_backend chose it: never
            raise TypeError(f"backend {backend_name!r} cannot hold streams")
        with self._guarded(backend_name, "open_stream", name):
            return backend.open_stream(self.vhost, name, segment_bytes=arguments.segment_bytes)

    def opens_at_once(self, backend_name: str) -> bool:
        """Whether the backend's stores open without blocking work (its ``opens_at_once``, as
        the memory backend's: no file is touched before a store pages out), so that a declare
        opens them on the Trio thread rather than in a worker thread."""
        return getattr(self.backends[backend_name], "opens_at_once", False) is True

    def open(self, name: str, backend_name: str, arguments: QueueArguments) -> None:
        """Open (recover) the queue's stores, so that creating the queue finds them open (a
        backend returns an open store again). Blocking: run in a worker thread."""
        if arguments.kind == STREAM:
            self.open_stream(backend_name, name, arguments)
        else:
            self.open_store(backend_name, name, arguments)

    def open_store(self, backend_name: str, name: str, arguments: QueueArguments) -> QueueStore:
        """The queue's store: one backend store, or one per level for a priority queue."""
        backend = self.backends[backend_name]
        names = store_names(name, arguments)
        with self._guarded(backend_name, "open_queue", name):
            if len(names) == 1:
                return backend.open_queue(self.vhost, name)
            return PriorityStore([backend.open_queue(self.vhost, n) for n in names])

    def delete_stores(self, backend_name: str, name: str, arguments: QueueArguments) -> None:
        """Delete what the queue stored (on a durable backend: also what a queue of that name
        left there before)."""
        backend = self.backends[backend_name]
        with self._guarded(backend_name, "delete_queue", name):
            for store_name in store_names(name, arguments):
                backend.delete_queue(self.vhost, store_name)

    @contextlib.contextmanager
    def _guarded(self, backend: str, call: str, queue: str) -> Iterator[None]:
        """A backend's bug (anything but ``OSError``, which callers answer as storage trouble)
        becomes a 541 naming the backend and its distribution."""
        try:
            yield
        except (OSError, AMQPError):
            raise
        except Exception as exc:
            failed = backend_failed(exc, backend=backend, call=call, queue=queue, vhost=self.vhost)
            raise failed from exc


# Out of space, quota, descriptors or memory: the resource the client asked too much of.
RESOURCE_ERRNOS: Final = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.ENOMEM}
)


def storage_error(exc: OSError, doing: str) -> AMQPError:
    """What a client is told when storage refused ``doing`` (its channel closes; the broker and
    the connection go on): 506 RESOURCE_ERROR when out of space or file descriptors, else 541
    INTERNAL_ERROR, with the operating system's words."""
    code = ReplyCode.RESOURCE_ERROR if exc.errno in RESOURCE_ERRNOS else ReplyCode.INTERNAL_ERROR
    return AMQPError(code, f"cannot {doing}: {exc}", hard=False)


def store_names(queue: str, arguments: QueueArguments) -> list[str]:
    """The backend stores of a queue: its name, plus one per level above 0 for a priority
    queue."""
    if arguments.priority_levels > 0:
        return level_store_names(queue, arguments.priority_levels)
    return [queue]
