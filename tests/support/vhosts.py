"""A virtual host without a broker around it, on the memory backend, for tests of the broker
layer (routing, publish, queue semantics): ``memory_vhost(nursery)`` and the declare calls with
the defaults an AMQP client's declare has."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from tqbroker.backends.memory import MemoryBackend
from tqbroker.broker.exchange import Exchange
from tqbroker.broker.queue import Queue
from tqbroker.broker.vhost import VirtualHost
from tqbroker.plugins.loader import load_exchange_types
from tqbroker.plugins.spec import ExchangeType


def memory_vhost(
    nursery: trio.Nursery, extra_exchange_types: Mapping[str, ExchangeType] | None = None
) -> VirtualHost:
    """Vhost "/" with the installed exchange types (and ``extra_exchange_types``), its queues
    in memory, its background tasks in ``nursery``."""
    return VirtualHost(
        "/",
        exchange_types={**load_exchange_types(), **(extra_exchange_types or {})},
        backends={"memory": MemoryBackend()},
        flushers={},
        durable_backend="memory",
        spawn=lambda fn, on_failure=None: nursery.start_soon(fn),
    )


def declare_queue(vhost: VirtualHost, name: str, **arguments: Any) -> Queue:
    """A non-durable queue, declared as ``queue.declare`` with ``arguments`` would."""
    return declare_owned_queue(vhost, name, None, **arguments)


def declare_owned_queue(vhost: VirtualHost, name: str, owner: object, **arguments: Any) -> Queue:
    """An exclusive queue of ``owner`` (a connection) when ``owner`` is given."""
    return vhost.declare_queue(
        name,
        passive=False,
        durable=False,
        exclusive=owner is not None,
        auto_delete=False,
        arguments=arguments,
        owner=owner,
    )


def declare_exchange(vhost: VirtualHost, name: str, kind: str, **arguments: Any) -> Exchange:
    """A non-durable, non-internal exchange of type ``kind``."""
    return vhost.declare_exchange(
        name,
        kind,
        passive=False,
        durable=False,
        auto_delete=False,
        internal=False,
        arguments=arguments,
    )
