"""The definitions catalog's three-way merge: a node's durable topology against the cluster's
(in etcd), over the entries both last agreed on.

Definitions are entries: a key (``defs/{vhost}/queues/{name}``, ``defs/{vhost}/exchanges/...``,
``defs/{vhost}/bindings/...``, ``defs/{vhost}/permissions/{user}``,
``defs/{vhost}/topic_permissions/...``, ``defs/vhosts/{vhost}``, ``defs/users/{user}``) and
the entry's canonical JSON, as
RabbitMQ's definitions document holds it (``entries``). A node keeps the entries it last saw
agree with etcd (the base). Then, for each key:

| base | local | cluster | means | so |
|---|---|---|---|---|
| absent | x | absent | declared here | put x in etcd |
| x | absent | x | deleted here | delete in etcd |
| absent | absent | x | declared elsewhere | create here |
| x | x | absent | deleted elsewhere | delete here |
| x | y | x | changed here | put y in etcd |
| x | x | y | changed elsewhere | change here |
| any | y | z (y != z, both changed) | a conflict | etcd's stands: change here |

etcd's entry wins a conflict: it was written first (every write is a compare on the base's mod
revision, so a node that lost the race sees the other's entry before writing its own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs

from .records import key_part

Entries = Mapping[str, bytes]


@attrs.frozen
class Merge:
    to_cluster: dict[str, bytes | None]  # key -> entry to put (None: delete)
    to_local: dict[str, bytes | None]  # key -> entry to create or change here (None: delete)


def merge(base: Entries, local: Entries, cluster: Entries) -> Merge:
    """What each side must take from the other (see the module doc)."""
    to_cluster: dict[str, bytes | None] = {}
    to_local: dict[str, bytes | None] = {}
    for key in base.keys() | local.keys() | cluster.keys():
        was, here, there = base.get(key), local.get(key), cluster.get(key)
        if here == there:
            continue
        if there == was:  # only this node changed it
            to_cluster[key] = here
        else:  # the cluster changed it (alone, or first: a conflict goes its way)
            to_local[key] = there
    return Merge(to_cluster, to_local)


def canonical(entry: Mapping[str, Any]) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()


def entries(document: Mapping[str, Any]) -> dict[str, bytes]:
    """A whole-broker definitions document (RabbitMQ's format) as catalog entries: the vhosts,
    durable exchanges, durable queues, users, permissions, topic permissions and bindings."""
    found: dict[str, bytes] = {}
    for vhost in document.get("vhosts", []):
        found[f"defs/vhosts/{key_part(vhost['name'])}"] = canonical(vhost)
    for queue in document.get("queues", []):
        if queue.get("durable", True):
            found[_key(queue["vhost"], "queues", queue["name"])] = canonical(queue)
    for exchange in document.get("exchanges", []):
        if exchange.get("durable", True):
            found[_key(exchange["vhost"], "exchanges", exchange["name"])] = canonical(exchange)
    for user in document.get("users", []):
        found[f"defs/users/{key_part(user['name'])}"] = canonical(user)
    for permission in document.get("permissions", []):
        found[_key(permission["vhost"], "permissions", permission["user"])] = canonical(permission)
    for topic in document.get("topic_permissions", []):
        name = json.dumps([topic["user"], topic["exchange"]], separators=(",", ":"))
        found[_key(topic["vhost"], "topic_permissions", name)] = canonical(topic)
    for binding in document.get("bindings", []):
        # A binding is its ends, key and arguments: its key names them (the arguments by hash).
        ends = [
            str(binding.get(part, ""))
            for part in ("source", "destination_type", "destination", "routing_key")
        ]
        arguments = hashlib.sha256(canonical(binding.get("arguments", {}))).hexdigest()[:16]
        name = json.dumps([*ends, arguments], separators=(",", ":"))
        found[_key(binding["vhost"], "bindings", name)] = canonical(binding)
    return found


def _key(vhost: str, kind: str, name: str) -> str:
    return f"defs/{key_part(vhost)}/{kind}/{key_part(name)}"
