"""Durable definitions: the vhosts' durable exchanges, queues and bindings, and their file.

Responsibilities:
- ``definitions``: what of a vhost survives a restart (durable exchanges but the predeclared
  ones, durable non-exclusive queues with the backend they live on, bindings between durable
  ends), as plain data;
- ``restore``: recreate a vhost's definitions at startup (an exchange whose type is gone is
  logged and skipped);
- ``missing_backend``: why stored definitions cannot be restored without losing messages (a
  queue or a holding exchange on a backend that is not loaded);
- the file: ``<data_dir>/definitions.cbor``, written atomically (temp file, fsync, rename,
  directory fsync).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cbor2

from ..fsutil import atomic_write
from ..protocol.errors import AMQPError
from .arguments import QueueArguments
from .exchange import Exchange
from .exchange_types import new_exchange
from .holding import HoldingExchange
from .queue import Queue
from .vhost import VirtualHost

log = logging.getLogger(__name__)

DEFINITIONS_FILE = "definitions.cbor"


def definitions(vhost: VirtualHost) -> dict[str, list[dict[str, Any]]]:
    """The durable exchanges, queues and bindings, for the definitions file."""
    exchanges = [
        {
            "name": x.name,
            "type": x.type_name,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
            "arguments": x.arguments,
            # Where a holding exchange's store is (it reopens there after a restart).
            **(
                {"store_backend": x.context.backend_name}
                if isinstance(x, HoldingExchange) and x.context is not None
                else {}
            ),
        }
        for x in vhost.exchanges.values()
        if x.durable and x.name and not x.name.startswith("amq.")
    ]
    queues = [
        {
            "name": q.name,
            "backend": q.backend_name,
            "auto_delete": q.auto_delete,
            "arguments": q.arguments.table,
        }
        for q in vhost.queues.values()
        if q.durable and q.exclusive_owner is None
    ]
    bindings = [
        {
            "source": source.name,
            "destination": dest.name,
            "destination_type": "queue" if isinstance(dest, Queue) else "exchange",
            "routing_key": key,
            "arguments": arguments,
        }
        for source in vhost.exchanges.values()
        if source.durable
        for (dest, key, _args_id), arguments in source.bindings.items()
        if isinstance(dest, Queue | Exchange)
        and dest.durable
        and not (isinstance(dest, Queue) and dest.exclusive_owner is not None)
    ]
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def restore(vhost: VirtualHost, definitions: Mapping[str, list[dict[str, Any]]]) -> None:
    """Recreate durable definitions saved by ``definitions`` (at startup)."""
    vhost.routing.changed()
    for x in definitions.get("exchanges", []):
        if x["type"] not in vhost.exchange_types:
            log.error(
                "vhost %s: cannot restore exchange %r: no exchange type %r",
                vhost.name,
                x["name"],
                x["type"],
            )
            continue
        try:
            vhost.exchanges[x["name"]] = new_exchange(
                vhost,
                x["name"],
                x["type"],
                durable=True,
                auto_delete=x["auto_delete"],
                internal=x["internal"],
                arguments=x["arguments"],
                store_backend=x.get("store_backend"),
                restoring=True,
            )
        except AMQPError as exc:  # e.g. what an exchange type needs is no longer installed
            log.error("vhost %s: cannot restore exchange %r: %s", vhost.name, x["name"], exc)
    for q in definitions.get("queues", []):
        vhost.create_queue(
            q["name"],
            q["backend"],
            durable=True,
            exclusive_owner=None,
            auto_delete=q["auto_delete"],
            arguments=QueueArguments.parse(q["arguments"]),
        )
    for b in definitions.get("bindings", []):
        source = vhost.exchanges.get(b["source"])
        dest: Queue | Exchange | None = (
            vhost.queues.get(b["destination"])
            if b["destination_type"] == "queue"
            else vhost.exchanges.get(b["destination"])
        )
        if source is not None and dest is not None:
            ref = source.bind(dest, b["routing_key"], b["arguments"])
            if ref is not None:
                dest.bound_by.add(ref)
    vhost.routing.changed()


def missing_backend(stored: Mapping[str, Any], backends: Mapping[str, object]) -> str | None:
    """Why the stored definitions cannot be restored with ``backends`` without losing messages
    (None: they can)."""
    for vhost, defs in stored.get("definitions", {}).items():
        for queue in defs.get("queues", []):
            if queue["backend"] not in backends:
                # Recreating it elsewhere would orphan its messages for good.
                return (
                    f"durable queue {queue['name']!r} in vhost {vhost!r} is stored on the "
                    f"{queue['backend']!r} backend, which is not loaded; install or fix it "
                    "(refusing to start rather than lose its messages)"
                )
        for exchange in defs.get("exchanges", []):
            # An exchange type that holds messages keeps them in a store of its own.
            backend = exchange.get("store_backend")
            if backend is not None and backend not in backends:
                return (
                    f"durable exchange {exchange['name']!r} in vhost {vhost!r} holds its "
                    f"messages on the {backend!r} backend, which is not loaded; install or "
                    "fix it (refusing to start rather than lose its messages)"
                )
    return None


def load_definitions(data_dir: Path) -> dict[str, Any]:
    """What the definitions file holds (empty when there is none)."""
    try:
        loaded = cbor2.loads((data_dir / DEFINITIONS_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def save_definitions(data_dir: Path, vhosts: Mapping[str, VirtualHost]) -> None:
    """Write the durable definitions of every vhost, atomically and durably."""
    data = cbor2.dumps(
        {
            "vhosts": list(vhosts),
            "definitions": {name: definitions(v) for name, v in vhosts.items()},
        }
    )
    atomic_write(data_dir / DEFINITIONS_FILE, data)
