"""The definitions catalog: a node's durable topology and the cluster's (``defs/...`` in etcd)
kept in step, so that any node routes any publish (§4.2 of ``shared/reference/scaleout.md``).

What is the cluster's (``cluster_entries``): vhosts, users (with their password hashes),
permissions and topic permissions, durable exchanges, stream queues and the bindings whose
destination is an exchange or a stream queue. Classic and quorum queues stay on the node that
declared them in this stage (their home node), and so do the bindings to them.

A round (``sync``), run at start and whenever either side changes (``COALESCE_SECONDS`` after
it: the changes of a burst take one round):
1. the local entries (an export of the broker), the cluster's (the view's cache) and the base
   (the entries both last agreed on, kept in ``cluster/catalog-base.json`` in the data
   directory so that a node back from a stop tells "deleted elsewhere" from "declared here");
2. the three-way merge (``catalog_merge.py``);
3. this node's changes go to etcd, each put or delete a compare on the mod revision the view
   last saw (or on absence), batched into transactions; a compare that failed means another
   node wrote first: the next round (the view then has its write) takes theirs;
4. the cluster's changes are made here: an import (strict off: an existing queue that differs
   is kept, and reported) and deletes;
5. the base becomes every entry the two sides now agree on.

``synced`` is set after the first round: a node serves clients only once it has caught up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import trio

from ..auth.internal import UserDbError
from ..broker.broker import Broker
from ..broker.definitions_api import export, import_document
from ..broker.definitions_json import (
    AUTH_SECTIONS,
    DefinitionsError,
    decode_table,
    parse_document,
)
from ..broker.queue import Queue
from ..protocol.errors import AMQPError
from .catalog_merge import Entries, canonical, entries, merge
from .metadata import MAX_TXN_OPS, Compare, Delete, MetadataError, MetadataStore, Put
from .view import ClusterView

log = logging.getLogger(__name__)

BASE_FILE: Final = Path("cluster") / "catalog-base.json"
RETRY_SECONDS: Final = 1.0
COALESCE_SECONDS: Final = 0.05  # a round waits this long after a change for more


def cluster_entries(document: Mapping[str, Any]) -> dict[str, bytes]:
    """The entries of a definitions document that are the cluster's (see the module doc)."""
    streams = {
        (q["vhost"], q["name"])
        for q in document.get("queues", [])
        if (q.get("arguments") or {}).get("x-queue-type") == "stream"
    }
    scoped = {
        "vhosts": document.get("vhosts", []),
        **{section: document.get(section, []) for section in AUTH_SECTIONS},
        "exchanges": document.get("exchanges", []),
        "queues": [q for q in document.get("queues", []) if (q["vhost"], q["name"]) in streams],
        "bindings": [
            b
            for b in document.get("bindings", [])
            if b.get("destination_type") == "exchange"
            or (b["vhost"], b.get("destination")) in streams
        ],
    }
    return entries(scoped)


class Catalog:
    """Keeps one broker's definitions and the cluster's in step (see the module doc)."""

    def __init__(self, broker: Broker, store: MetadataStore, view: ClusterView) -> None:
        self.broker = broker
        self.store = store
        self.view = view
        self.prefix = view.prefix
        self.base_path = broker.config.data_dir / BASE_FILE
        self.base: dict[str, bytes] = self._load_base()
        self.synced = trio.Event()
        self.conflicts: dict[str, str] = {}  # key -> why this node keeps its own entry

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sync at start (``task_status.started()`` once done) and after every change."""
        await self.view.ready.wait()
        started = False
        while True:
            seen = (
                self.broker.definitions.generation,
                self.view.definitions_generation,
                self.broker.users.generation,
            )
            try:
                await self.sync()
            except MetadataError as exc:
                log.warning("catalog: %s; again in %.1f s", exc, RETRY_SECONDS)
                await trio.sleep(RETRY_SECONDS)
                continue
            if not started:
                started = True
                self.synced.set()
                task_status.started()
            await self._changed_since(seen)
            await trio.sleep(COALESCE_SECONDS)  # a burst of declares: one round for all

    async def _changed_since(self, seen: tuple[int, int, int]) -> None:
        async with trio.open_nursery() as nursery:

            async def local() -> None:
                await self.broker.definitions.wait_change(seen[0])
                nursery.cancel_scope.cancel()

            async def users() -> None:
                await self.broker.users.wait_change(seen[2])
                nursery.cancel_scope.cancel()

            async def cluster() -> None:
                await self.view.wait_definitions(seen[1])
                nursery.cancel_scope.cancel()

            nursery.start_soon(local)
            nursery.start_soon(users)
            nursery.start_soon(cluster)

    # -- one round ------------------------------------------------------------------------------

    async def sync(self) -> None:
        """One round (see the module doc)."""
        local = cluster_entries(await export(self.broker, queues_kept=_replicated))
        known = dict(self.view.definitions)
        cluster = {key: value for key, (value, _revision) in known.items()}
        plan = merge(self.base, local, cluster)
        if plan.to_cluster:
            revision = await self._write(plan.to_cluster, known)
            await self.view.wait_for(revision)
        if plan.to_local:
            await self._apply(plan.to_local, local)
        local = cluster_entries(await export(self.broker, queues_kept=_replicated))
        cluster = {key: value for key, (value, _revision) in self.view.definitions.items()}
        await self._agree(local, cluster)

    async def _write(
        self, changes: Mapping[str, bytes | None], known: Mapping[str, tuple[bytes, int]]
    ) -> int:
        """Write this node's changes, a transaction per batch (one key at a time if a batch's
        compares fail); the store's revision after."""
        items = sorted(changes.items())
        revision = self.view.revision
        for start in range(0, len(items), MAX_TXN_OPS):
            batch = items[start : start + MAX_TXN_OPS]
            result = await self.store.txn(*self._guarded(batch, known))
            revision = max(revision, result.revision)
            if not result.succeeded:
                for item in batch:
                    one = await self.store.txn(*self._guarded([item], known))
                    revision = max(revision, one.revision)
                    if not one.succeeded:
                        log.info("catalog: %s was changed elsewhere first; taking theirs", item[0])
        return revision

    def _guarded(
        self, batch: list[tuple[str, bytes | None]], known: Mapping[str, tuple[bytes, int]]
    ) -> tuple[list[Compare], list[Put | Delete]]:
        compares: list[Compare] = []
        operations: list[Put | Delete] = []
        for key, entry in batch:
            full = f"{self.prefix}/{key}"
            seen = known.get(key)
            compares.append(
                Compare.absent(full) if seen is None else Compare.mod_revision(full, seen[1])
            )
            operations.append(Delete(full) if entry is None else Put(full, entry))
        return compares, operations

    async def _apply(self, changes: Mapping[str, bytes | None], local: Entries) -> None:
        """Make the cluster's changes here: deletes (bindings first, vhosts last), then one
        import of everything created or changed."""
        created = {key: entry for key, entry in changes.items() if entry is not None}
        deleted = [key for key, entry in changes.items() if entry is None]
        for key in sorted(deleted, key=_delete_order):
            try:
                await self._delete_here(key, local[key])
            except (AMQPError, OSError, KeyError) as exc:
                log.error("catalog: cannot delete %s here: %s", key, exc)
        if created:
            await self._import(created)

    async def _import(self, created: Mapping[str, bytes]) -> None:
        document: dict[str, list[Any]] = {
            section: [] for section in ("vhosts", "exchanges", "queues", "bindings", *AUTH_SECTIONS)
        }
        for key, entry in created.items():
            document[_kind(key)].append(json.loads(entry))
        named = {v["name"] for v in document["vhosts"]} | set(self.broker.vhosts)
        for section in ("exchanges", "queues", "bindings", "permissions", "topic_permissions"):
            named |= {e["vhost"] for e in document[section]}
        document["vhosts"] = [{"name": name} for name in sorted(named)]
        try:
            skipped = await import_document(self.broker, parse_document(document), strict=False)
        except (DefinitionsError, UserDbError) as exc:
            log.error("catalog: the cluster's definitions do not import here: %s", exc)
            return
        for line in skipped:
            log.warning("catalog: the cluster's definition not taken here: %s", line)

    async def _delete_here(self, key: str, entry: bytes) -> None:
        kind = _kind(key)
        if kind == "vhosts":
            await self.broker.delete_vhost(unquote(key.split("/")[2]))
            return
        found = json.loads(entry)
        if kind in ("users", *AUTH_SECTIONS):
            users = self.broker.users
            if kind == "users":
                users.delete_user(found["name"])
            elif kind == "permissions":
                users.clear_permissions(found["user"], found["vhost"])
            else:
                users.clear_topic_permissions(found["user"], found["vhost"], found["exchange"])
            await users.save(self.broker.config.data_dir)
            return
        vhost = self.broker.vhosts.get(found["vhost"])
        if vhost is None:
            return
        if kind == "queues":
            vhost.delete_queue(found["name"], if_unused=False, if_empty=False, owner=None)
        elif kind == "exchanges":
            vhost.delete_exchange(found["name"], if_unused=False)
        else:
            arguments = decode_table(found.get("arguments", {}), key)
            if found["destination_type"] == "exchange":
                vhost.unbind_exchange(
                    found["destination"], found["source"], found["routing_key"], arguments
                )
            else:
                vhost.unbind_queue(
                    found["destination"], found["source"], found["routing_key"], arguments, None
                )

    # -- the base -------------------------------------------------------------------------------

    async def _agree(self, local: Entries, cluster: Entries) -> None:
        """The base takes every entry the two sides agree on; a key they disagree on keeps
        its base (the next round decides it again)."""
        base = dict(self.base)
        conflicts: dict[str, str] = {}
        for key in base.keys() | local.keys() | cluster.keys():
            here, there = local.get(key), cluster.get(key)
            if here == there:
                if here is None:
                    base.pop(key, None)
                else:
                    base[key] = here
            elif here is not None and there is not None:
                conflicts[key] = "this node's definition differs from the cluster's"
        for key in conflicts.keys() - self.conflicts.keys():
            log.warning("catalog: %s: %s (kept here)", key, conflicts[key])
        self.conflicts = conflicts
        if base != self.base:
            self.base = base
            await trio.to_thread.run_sync(self._save_base)

    def _load_base(self) -> dict[str, bytes]:
        try:
            stored = json.loads(self.base_path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError as exc:  # a damaged file: a first sync, as a new node
            log.error("catalog: %s does not parse (%s); an empty base", self.base_path, exc)
            return {}
        return {key: canonical(entry) for key, entry in stored.items()}

    def _save_base(self) -> None:
        document = {key: json.loads(entry) for key, entry in sorted(self.base.items())}
        self.base_path.parent.mkdir(parents=True, exist_ok=True)
        self.broker.env.atomic_write(self.base_path, json.dumps(document).encode())


def _replicated(queue: Queue) -> bool:
    """A queue the cluster holds (a stream; classic and quorum queues stay on their node)."""
    return queue.queue_type == "stream"


def _kind(key: str) -> str:
    """What a catalog key names: ``vhosts`` or ``users`` (``defs/{kind}/{name}``), else
    ``exchanges``, ``queues``, ``bindings``, ``permissions`` or ``topic_permissions``
    (``defs/{vhost}/{kind}/{name}``)."""
    parts = key.split("/")
    return parts[1] if len(parts) == 3 else parts[2]


def _delete_order(key: str) -> int:
    order = ["bindings", "queues", "exchanges", "topic_permissions", "permissions", "users"]
    return [*order, "vhosts"].index(_kind(key))
