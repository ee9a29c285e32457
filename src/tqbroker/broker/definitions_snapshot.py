"""The definitions file's content, encoded at each write (``definitions_file.DefinitionsFile``
calls ``encode_snapshot`` on the broker's thread): RabbitMQ's definitions JSON
(``definitions_json``) of what survives a restart, one entry a line. Each queue's and each
binding's entry is encoded once in its life and cached, so that a write among 100k durable
queues and bindings costs a join of their bytes, not their encoding.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from typing import Any

from .._version import __version__
from .definitions import _exchanges
from .definitions_json import UNMODELLED, binding_json, exchange_json, head, queue_json
from .exchange import Exchange
from .queue import Queue
from .vhost import VirtualHost


def encode_snapshot(
    vhosts: Mapping[str, VirtualHost],
    metadata: Mapping[str, Mapping[str, Any]] | None = None,
    parameters: list[dict[str, Any]] | None = None,
) -> bytes:
    """The durable topology as the definitions file holds it: RabbitMQ's definitions JSON
    (``definitions_json``), one entry a line. Each queue's entry is encoded once in its life
    (``_queue_json``), so that a declare among 100k durable queues costs the event loop a join
    of their bytes, not their encoding. ``metadata``: vhosts' description and tags (in their
    ``vhosts`` entries, as RabbitMQ 3.11 exports them); ``parameters``: the vhost limits."""
    metadata = metadata or {}
    queues: list[bytes] = []
    exchanges: list[bytes] = []
    bindings: list[bytes] = []
    for name, vhost in vhosts.items():
        dormant = vhost.dormant.definitions()
        queues += [
            _queue_json(name, q)
            for q in vhost.queues.values()
            if q.durable and q.exclusive_owner is None
        ]
        queues += [_dumps(queue_json(name, entry)) for entry in dormant["queues"]]
        exchanges += [
            _dumps(exchange_json(name, x)) for x in _exchanges(vhost) + dormant["exchanges"]
        ]
        bindings += _binding_entries(name, vhost)
        bindings += [_dumps(binding_json(name, b)) for b in dormant["bindings"]]
    opening = {
        **head(__version__),
        "users": [],
        "vhosts": [{"name": name, **metadata.get(name, {})} for name in vhosts],
        "permissions": [],  # users and permissions are in users.json (auth.internal)
        "topic_permissions": [],
        **{section: [] for section in UNMODELLED},
        "parameters": parameters or [],
    }
    parts = [_dumps(opening)[:-1]]
    for section, entries in (("queues", queues), ("exchanges", exchanges), ("bindings", bindings)):
        parts.append(b',\n"%s": [\n' % section.encode() + b",\n".join(entries) + b"\n]")
    parts.append(b"}\n")
    return b"".join(parts)


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# Each durable queue's entry in the file, encoded once per arguments: what it holds (name,
# backend, auto-delete) never changes, its arguments only when a topic's configs are altered
# (``StreamQueue.reconfigure`` gives it new ones). Kept as long as the queue lives.
_QUEUE_ENTRIES: weakref.WeakKeyDictionary[Queue, tuple[object, bytes]] = weakref.WeakKeyDictionary()


def _queue_json(vhost: str, queue: Queue) -> bytes:
    cached = _QUEUE_ENTRIES.get(queue)
    if cached is not None and cached[0] is queue.arguments:
        return cached[1]
    encoded = _dumps(queue_json(vhost, stored_queue(queue)))
    _QUEUE_ENTRIES[queue] = (queue.arguments, encoded)
    return encoded


# Each durable exchange's bindings' entries, encoded once per binding: what a binding is never
# changes. Rebuilt at each write from those still there (unbound ones go).
_BINDING_ENTRIES: weakref.WeakKeyDictionary[Exchange, dict[object, bytes]] = (
    weakref.WeakKeyDictionary()
)


def _binding_entries(vhost_name: str, vhost: VirtualHost) -> list[bytes]:
    """The entries of ``_bindings(vhost)``, from the cache where they are (100k bindings: ~30 ms
    rather than ~1.2 s of encoding at each write)."""
    entries: list[bytes] = []
    for source in vhost.exchanges.values():
        if not (source.name and source.durable):
            continue
        cached = _BINDING_ENTRIES.get(source, {})
        kept: dict[object, bytes] = {}
        for binding, arguments in source.bindings.items():
            dest, key, _args_id = binding
            if not (isinstance(dest, Queue | Exchange) and dest.durable) or (
                isinstance(dest, Queue) and dest.exclusive_owner is not None
            ):
                continue
            encoded = cached.get(binding)
            if encoded is None:
                stored = {
                    "source": source.name,
                    "destination": dest.name,
                    "destination_type": "queue" if isinstance(dest, Queue) else "exchange",
                    "routing_key": key,
                    "arguments": arguments,
                }
                encoded = _dumps(binding_json(vhost_name, stored))
            kept[binding] = encoded
            entries.append(encoded)
        if kept:
            _BINDING_ENTRIES[source] = kept
        else:
            _BINDING_ENTRIES.pop(source, None)
    return entries


def stored_queue(queue: Queue) -> dict[str, Any]:
    """A queue in the stored form (``definitions_json.queue_json`` makes its entry)."""
    return {
        "name": queue.name,
        "backend": queue.backend_name,
        "auto_delete": queue.auto_delete,
        "arguments": queue.arguments.table,
    }
