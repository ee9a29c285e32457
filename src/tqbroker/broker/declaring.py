"""The checks of a ``queue.declare`` (``VirtualHost.declare_queue``), in RabbitMQ's order.

Responsibilities:
- ``check_queue_declare``: passive lookups, the reserved ``amq.`` prefix (403), the arguments
  (``broker/arguments.py``), dormant names, an existing queue's exclusive owner (405) and
  equivalence (406); else what the queue to create is (its name, backend and typed arguments);
- ``empty_transient``: a transient queue on a durable backend starts empty;
- ``server_name``: the ``amq.gen-`` name of a queue declared without one.
"""

from __future__ import annotations

import base64
import logging
import os
from typing import TYPE_CHECKING

from ..protocol.codec import FieldTable
from ..protocol.errors import AMQPError, ReplyCode
from .arguments import (
    STREAM,
    QueueArguments,
    check_declaration,
    check_equivalent,
    compared_arguments,
)
from .queue import Queue

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


def server_name() -> str:
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
