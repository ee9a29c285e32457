"""Queues made by their kind (``new_queue``): a stream (``x-queue-type=stream``) on its
partition's log, else a classic queue on its store, both opened through the vhost's
``QueueStorage``; a store that cannot open (out of descriptors or space) is a 506 naming the
queue. Not registered in the vhost, and its actor not started: the vhost does both."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .arguments import STREAM, QueueArguments
from .classic import ClassicQueue
from .queue import Queue
from .storage import storage_error
from .streams.queue import StreamQueue

if TYPE_CHECKING:
    from .vhost import VirtualHost


def new_queue(
    vhost: VirtualHost,
    name: str,
    backend_name: str,
    *,
    durable: bool,
    exclusive_owner: object | None,
    auto_delete: bool,
    arguments: QueueArguments,
) -> Queue:
    flusher = vhost.flushers.get(backend_name)
    try:
        if arguments.kind == STREAM:
            return StreamQueue(
                vhost.name,
                name,
                vhost.storage.open_stream(backend_name, name, arguments),
                host=vhost,
                backend_name=backend_name,
                arguments=arguments,
                flusher=flusher,
                groups=vhost.consumer_groups,
            )
        return ClassicQueue(
            vhost.name,
            name,
            vhost.storage.open_store(backend_name, name, arguments),
            host=vhost,
            backend_name=backend_name,
            durable=durable,
            exclusive_owner=exclusive_owner,
            auto_delete=auto_delete,
            arguments=arguments,
            flusher=flusher,
        )
    except OSError as exc:  # e.g. out of file descriptors or disk space
        doing = f"open the storage of queue '{name}' in vhost '{vhost.name}'"
        raise storage_error(exc, doing) from None
