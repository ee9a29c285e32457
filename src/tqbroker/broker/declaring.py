"""The checks of a ``queue.declare`` (``VirtualHost.declare_queue``), in RabbitMQ's order.

Responsibilities:
- ``check_queue_declare``: passive lookups, the reserved ``amq.`` prefix (403), the arguments
  (``broker/arguments.py``), dormant names, an existing queue's exclusive owner (405) and
  equivalence (406); else what the queue to create is (its name, backend and typed arguments);
- ``empty_transient``: a transient queue on a durable backend starts empty;
- ``open_and_declare_queue``: a declare whose new queue's stores open (recover) in a worker
  thread first (``open_storage``; a definitions import opens many at once with it), unless
  they are in memory (then on the spot: a thread hop cost more than the whole declare);
- ``server_name``: the ``amq.gen-`` name of a queue declared without one.
"""

from __future__ import annotations

import base64
import logging
import os
from typing import TYPE_CHECKING

import trio

from ..protocol.codec import FieldTable
from ..protocol.errors import AMQPError, ReplyCode
from .arguments import (
    CLASSIC,
    STREAM,
    QueueArguments,
    check_declaration,
    check_equivalent,
    compared_arguments,
)
from .limits import queue_limit_error
from .queue import Queue
from .storage import storage_error

if TYPE_CHECKING:
    from .vhost import VirtualHost

log = logging.getLogger(__name__)


def check_queue_declare(
    vhost: VirtualHost,
    name: str,
    passive: bool,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: FieldTable,
    owner: object,
    prepared: bool = False,
) -> Queue | tuple[str, str, QueueArguments]:
    """The AMQP checks of a declare: the existing queue, or the name, backend and arguments
    of the queue to create (``prepared``: named by the vhost already, maybe "amq.gen-")."""
    if passive:
        return vhost.get_queue(name, owner)
    if name.startswith("amq.") and not prepared:
        raise AMQPError(
            ReplyCode.ACCESS_REFUSED,
            f"queue name '{name}' contains reserved prefix 'amq.*'",
        )
    name = name or server_name()
    # No arguments: a classic queue, nothing to check (the commonest declare, made cheap).
    kind = CLASSIC
    if arguments:
        kind = check_declaration(
            name,
            vhost.name,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )
    if kind == STREAM:
        vhost.storage.stream_backend(name, QueueArguments.parse(arguments))
    vhost.dormant.check_declare("queue", name)
    existing = vhost.queues.get(name)
    if existing is not None:
        existing.touch()
        # RabbitMQ answers an exclusive mismatch with 405, before any other check.
        if existing.exclusive_owner is not (owner if exclusive else None):
            vhost.lock_error(existing)
        check_equivalent(
            f"for queue '{name}' in vhost '{vhost.name}'",
            {
                "durable": (durable, existing.durable),
                "auto_delete": (auto_delete, existing.auto_delete),
            },
            compared_arguments(arguments),
            compared_arguments(existing.arguments.table),
        )
        return existing
    limit = vhost.queue_limit()
    if limit is not None and len(vhost.queues) >= limit:
        raise queue_limit_error(name, vhost.name, limit)
    parsed = QueueArguments.parse(arguments)
    backend_name = vhost.storage.backend_for(
        name, durable=durable, exclusive=exclusive, arguments=parsed
    )
    return name, backend_name, parsed


def empty_transient(
    vhost: VirtualHost, name: str, backend_name: str, arguments: QueueArguments, *, durable: bool
) -> None:
    """A transient queue on a durable backend starts empty: whatever a queue of that name left
    there goes (durably once the backend's next flush is done: its declare-ok waits)."""
    if vhost.backends[backend_name].durable and not durable:
        vhost.storage.delete_stores(backend_name, name, arguments)
        vhost.definitions.changed_after(vhost.flushers.get(backend_name), definitions=False)


async def open_and_declare_queue(
    vhost: VirtualHost,
    name: str,
    *,
    passive: bool,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: FieldTable,
    owner: object,
) -> Queue:
    """``declare_queue``, with a new queue's stores opened (recovered) in a worker thread
    first; a declare of a name being opened waits for it. Then ``declare_queue`` checks
    again (someone may have declared it meanwhile, over HTTP say) and creates it. A queue in
    memory (a transient one, mostly) opens at once: checked once, created here, no thread."""
    while (opening := vhost.opening.get(name)) is not None:
        await opening.wait()
    found = check_queue_declare(
        vhost, name, passive, durable, exclusive, auto_delete, arguments, owner
    )
    if isinstance(found, Queue):
        return found
    if vhost.storage.opens_at_once(found[1]):
        return vhost.create_declared(
            found, durable=durable, exclusive=exclusive, auto_delete=auto_delete, owner=owner
        )
    await open_storage(vhost, found, durable=durable)
    return vhost.declare_queue(
        found[0],
        passive=False,
        durable=durable,
        exclusive=exclusive,
        auto_delete=auto_delete,
        arguments=arguments,
        owner=owner,
        prepared=True,
    )


async def open_storage(
    vhost: VirtualHost, found: tuple[str, str, QueueArguments], *, durable: bool
) -> None:
    """Open (recover) the stores of the queue ``check_queue_declare`` found to create, in a
    worker thread; a declare of that name meanwhile waits (``vhost.opening``)."""
    vhost.opening[found[0]] = done = trio.Event()
    try:
        empty_transient(vhost, *found, durable=durable)
        await trio.to_thread.run_sync(vhost.storage.open, *found)
    except OSError as exc:  # out of descriptors or space, say: this declare fails alone
        doing = f"open the storage of queue '{found[0]}' in vhost '{vhost.name}'"
        raise storage_error(exc, doing) from None
    finally:
        del vhost.opening[found[0]]
        done.set()


def server_name() -> str:
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
