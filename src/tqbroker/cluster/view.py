"""A node's cached view of the cluster's keys in etcd: listed once, then followed by a watch
from the next revision (listed again when the watch's revision was compacted away, or the
watch broke off), so every node decides from the same records (§4.2 of
``shared/reference/scaleout.md``).

Responsibilities:
- the decoded records (``records.py``): registered nodes, the controller and its key's create
  revision (the controller's fencing token), partitions with their mod revisions (what each
  compare-and-swap compares), replica reports, consumer groups' members (with their keys'
  create revisions: the nodes' join order) and assignments (with their mod revisions), and the
  stream queues' definitions (the ``defs/{vhost}/queues/{queue}`` entries of stream queues:
  what the controller places);
- ``revision``: the store revision the view has reached; ``wait_for(revision)`` for
  read-your-writes (a node that wrote at revision R acts once its view has R);
- ``changed``: an event set at every batch applied (the controller and the node's partition
  roles re-read the view then). A record that does not decode is logged and left out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import unquote

import attrs
import trio

from .metadata import Compacted, KeyValue, MetadataError, MetadataStore, WatchEvent
from .records import (
    ControllerRecord,
    GroupAssignment,
    GroupMembers,
    NodeRecord,
    PartitionRecord,
    RecordError,
    ReplicaReport,
    controller_key,
    groups_prefix,
    key_part,
    nodes_prefix,
    partitions_prefix,
    preferred_election_key,
    replicas_prefix,
)

log = logging.getLogger(__name__)

RETRY_SECONDS: Final = 0.5
DEFS: Final = "defs/"

Name = tuple[str, str]  # (vhost, queue)


@attrs.frozen
class StreamDefinition:
    """A stream queue's definition as the controller needs it: how many replicas it wants and
    how many must be in sync (None: the defaults, min(3, nodes) and min(2, replicas))."""

    replicas: int | None
    min_isr: int | None


def stream_definition(raw: bytes) -> StreamDefinition | None:
    """The stream a queue definition (a RabbitMQ definitions entry, JSON) declares; None for
    another kind of queue (or an entry that does not parse: logged by the caller)."""
    entry = json.loads(raw)
    arguments = entry.get("arguments") or {}
    if arguments.get("x-queue-type") != "stream":
        return None

    def count(name: str) -> int | None:
        value = arguments.get(name)
        return int(value) if isinstance(value, int) and value >= 1 else None

    return StreamDefinition(count("x-stream-replicas"), count("x-stream-min-insync-replicas"))


class ClusterView:
    """The cached records of one cluster (see the module doc)."""

    def __init__(self, store: MetadataStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self.nodes: dict[str, NodeRecord] = {}
        self.controller: ControllerRecord | None = None
        self.controller_revision = 0  # the controller key's create revision
        self.partitions: dict[Name, tuple[PartitionRecord, int]] = {}  # with the mod revision
        self.reports: dict[tuple[str, str, str], ReplicaReport] = {}  # (node, vhost, queue)
        self.streams: dict[Name, StreamDefinition] = {}
        # Consumer groups, by (vhost, group): each node's members (with the create revision)
        # and the assignment (with the mod revision).
        self.group_members: dict[Name, dict[str, tuple[GroupMembers, int]]] = {}
        self.group_assignments: dict[Name, tuple[GroupAssignment, int]] = {}
        self.preferred_election = 0  # a request's mod revision (0: none pending)
        # Every definitions entry, by its key below the prefix (``defs/...``), with its mod
        # revision (the catalog's compare), and a count of their changes.
        self.definitions: dict[str, tuple[bytes, int]] = {}
        self.definitions_generation = 0
        self._definitions_changed = trio.Event()
        self.revision = 0
        self.changed = trio.Event()
        self._advanced = trio.Event()
        self.ready = trio.Event()  # the first listing is in

    # -- reading it ----------------------------------------------------------------------------

    @property
    def live(self) -> dict[str, int]:
        """Registered nodes: node id -> incarnation."""
        return {node: record.incarnation for node, record in self.nodes.items()}

    def reports_for(self, vhost: str, queue: str) -> dict[str, ReplicaReport]:
        return {n: r for (n, v, q), r in self.reports.items() if (v, q) == (vhost, queue)}

    async def wait_for(self, revision: int) -> None:
        """Until the view has applied the store's ``revision``."""
        while self.revision < revision:
            await self._advanced.wait()

    async def wait_definitions(self, since: int) -> None:
        """Until ``definitions_generation`` has moved past ``since``."""
        while self.definitions_generation == since:
            await self._definitions_changed.wait()

    def _definitions_moved(self) -> None:
        self.definitions_generation += 1
        moved, self._definitions_changed = self._definitions_changed, trio.Event()
        moved.set()

    async def wait_changed(self) -> None:
        await self.changed.wait()
        self.changed = trio.Event()

    # -- following the store -----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            try:
                listed = await self.store.get(self.prefix + "/", prefix=True)
                self._replace(listed.kvs, listed.revision)
                if not started:
                    started = True
                    task_status.started()
                async with self.store.watch(
                    self.prefix + "/", prefix=True, start_revision=listed.revision + 1
                ) as events:
                    async for batch in events:
                        self._apply(batch)
            except Compacted:
                log.info("cluster view: history compacted; listing again")
            except MetadataError as exc:
                log.warning("cluster view: %s; listing again in %.1f s", exc, RETRY_SECONDS)
                if not started:
                    started = True
                    task_status.started()
                await trio.sleep(RETRY_SECONDS)

    def _replace(self, kvs: Sequence[KeyValue], revision: int) -> None:
        self.nodes.clear()
        self.controller, self.controller_revision = None, 0
        self.partitions.clear()
        self.reports.clear()
        self.streams.clear()
        self.group_members.clear()
        self.group_assignments.clear()
        self.preferred_election = 0
        self.definitions.clear()
        self._definitions_moved()
        for kv in kvs:
            self._put(kv)
        self._reached(max(revision, self.revision))
        self.ready.set()

    def _apply(self, batch: Sequence[WatchEvent]) -> None:
        revision = self.revision
        for event in batch:
            if event.kind == "put":
                self._put(event.kv)
            else:
                self._delete(event.kv.key)
            revision = max(revision, event.kv.mod_revision)
        self._reached(revision)

    def _reached(self, revision: int) -> None:
        self.revision = revision
        self.changed.set()
        advanced, self._advanced = self._advanced, trio.Event()
        advanced.set()

    def _put(self, kv: KeyValue) -> None:
        key = kv.key
        try:
            if key.startswith(nodes_prefix(self.prefix)):
                record = NodeRecord.decode(kv.value)
                self.nodes[record.node] = record
            elif key == controller_key(self.prefix):
                self.controller = ControllerRecord.decode(kv.value)
                self.controller_revision = kv.create_revision
            elif key.startswith(partitions_prefix(self.prefix)):
                self.partitions[self._name(key, partitions_prefix)] = (
                    PartitionRecord.decode(kv.value),
                    kv.mod_revision,
                )
            elif key.startswith(replicas_prefix(self.prefix)):
                node, vhost, queue = self._parts(key, replicas_prefix(self.prefix), 3)
                self.reports[(node, vhost, queue)] = ReplicaReport.decode(kv.value)
            elif key.startswith(groups_prefix(self.prefix)):
                self._put_group(key, kv)
            elif key == preferred_election_key(self.prefix):
                self.preferred_election = kv.mod_revision
            elif key.startswith(f"{self.prefix}/{DEFS}"):
                self.definitions[key.removeprefix(f"{self.prefix}/")] = (kv.value, kv.mod_revision)
                self._definitions_moved()
                self._put_definition(key, kv.value)
        except (RecordError, ValueError) as exc:
            log.error("cluster view: %s: %s (left out)", key, exc)

    def _group_parts(self, key: str) -> tuple[str, ...]:
        """``(vhost, group, "members", node)`` or ``(vhost, group, "assignment")``."""
        return tuple(unquote(p) for p in key.removeprefix(groups_prefix(self.prefix)).split("/"))

    def _put_group(self, key: str, kv: KeyValue) -> None:
        parts = self._group_parts(key)
        if parts[2:3] == ("members",) and len(parts) == 4:
            members = self.group_members.setdefault((parts[0], parts[1]), {})
            members[parts[3]] = (GroupMembers.decode(kv.value), kv.create_revision)
        elif parts[2:] == ("assignment",):
            self.group_assignments[(parts[0], parts[1])] = (
                GroupAssignment.decode(kv.value),
                kv.mod_revision,
            )

    def _delete_group(self, key: str) -> None:
        parts = self._group_parts(key)
        if parts[2:3] == ("members",) and len(parts) == 4:
            members = self.group_members.get((parts[0], parts[1]), {})
            members.pop(parts[3], None)
            if not members:
                self.group_members.pop((parts[0], parts[1]), None)
        elif parts[2:] == ("assignment",):
            self.group_assignments.pop((parts[0], parts[1]), None)

    def _put_definition(self, key: str, value: bytes) -> None:
        parts = key.removeprefix(f"{self.prefix}/{DEFS}").split("/")
        if len(parts) == 3 and parts[1] == "queues":
            name = (unquote(parts[0]), unquote(parts[2]))
            stream = stream_definition(value)
            if stream is None:
                self.streams.pop(name, None)
            else:
                self.streams[name] = stream

    def _delete(self, key: str) -> None:
        if key.startswith(nodes_prefix(self.prefix)):
            self.nodes.pop(unquote(key.removeprefix(nodes_prefix(self.prefix))), None)
        elif key == controller_key(self.prefix):
            self.controller, self.controller_revision = None, 0
        elif key.startswith(partitions_prefix(self.prefix)):
            self.partitions.pop(self._name(key, partitions_prefix), None)
        elif key.startswith(replicas_prefix(self.prefix)):
            node, vhost, queue = self._parts(key, replicas_prefix(self.prefix), 3)
            self.reports.pop((node, vhost, queue), None)
        elif key.startswith(groups_prefix(self.prefix)):
            self._delete_group(key)
        elif key == preferred_election_key(self.prefix):
            self.preferred_election = 0
        elif key.startswith(f"{self.prefix}/{DEFS}"):
            self.definitions.pop(key.removeprefix(f"{self.prefix}/"), None)
            self._definitions_moved()
            parts = key.removeprefix(f"{self.prefix}/{DEFS}").split("/")
            if len(parts) == 3 and parts[1] == "queues":
                self.streams.pop((unquote(parts[0]), unquote(parts[2])), None)

    def _name(self, key: str, prefix_of: Any) -> Name:
        vhost, queue = self._parts(key, prefix_of(self.prefix), 2)
        return vhost, queue

    @staticmethod
    def _parts(key: str, prefix: str, count: int) -> tuple[str, ...]:
        parts = key.removeprefix(prefix).split("/")
        if len(parts) != count:
            raise ValueError(f"a key of {len(parts)} part(s), not {count}")
        return tuple(unquote(part) for part in parts)


def definition_key(prefix: str, vhost: str, kind: str, name: str) -> str:
    """The key of a definition (``kind``: ``queues``, ``exchanges``, ...)."""
    return f"{prefix}/{DEFS}{key_part(vhost)}/{kind}/{key_part(name)}"
