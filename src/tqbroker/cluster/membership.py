"""A node's membership of the cluster: its registration under a lease, kept alive while its
disk keeps up (``shared/reference/scaleout.md`` §4.3; LavinMQ #1573, #2151).

Responsibilities:
- the node id: the ``node-id`` file in the data directory (written on first start; a
  ``--node-id`` given later must match it);
- registration: a new lease (its id is the node's **incarnation**) and ``nodes/{id}`` bound to
  it. A record left by this node's previous run (another lease: it was killed) is taken over:
  that lease is revoked first, so the controller sees the old incarnation end at once rather
  than after its TTL;
- keepalive every TTL/3, one request each (etcd's JSON gateway answers a streamed keepalive
  only at its end), **only while the node's flushers keep up**: a flusher with work pending
  for more than TTL/2 stops the renewals, so a node whose disk hangs loses its lease and its
  leaderships (LavinMQ's zombie leader, #2151);
- losing the lease (expired, revoked, or no successful keepalive for a whole TTL) is never an
  exit (LavinMQ's ``exit 3`` turned etcd hiccups into restarts): the node tells its owner
  (``on_lost``: step down from every leadership), registers again under a new incarnation as
  soon as etcd answers and its disk keeps up, and tells its owner of that too (``on_registered``).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs
import trio

from ..storage_env import StorageEnv
from .metadata import (
    Compare,
    Get,
    LeaseLost,
    MetadataError,
    MetadataStore,
    MetadataUnavailable,
    Put,
    RangeResult,
)
from .records import NodeRecord, RecordError, node_key

log = logging.getLogger(__name__)

NODE_ID_FILE: Final = "node-id"
NODE_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
RETRY_SECONDS: Final = 0.5


class NodeIdError(ValueError):
    """The node id is malformed, or not the one this data directory belongs to."""


def load_node_id(data_dir: Path, wanted: str | None, env: StorageEnv | None = None) -> str:
    """The data directory's node id: ``wanted`` (written on first start, durably through
    ``env``: a power cut must not give the node another identity), the stored one, or a new
    one. ``NodeIdError`` if ``wanted`` differs from the stored id or is malformed."""
    path = data_dir / NODE_ID_FILE
    try:
        stored: str | None = path.read_text().strip()
    except FileNotFoundError:
        stored = None
    if wanted is not None and not NODE_ID_PATTERN.fullmatch(wanted):
        raise NodeIdError(
            f"node id {wanted!r}: letters, digits, '.', '_' and '-', at most 64, "
            "starting with a letter or digit"
        )
    if stored:
        if wanted is not None and wanted != stored:
            raise NodeIdError(
                f"this data directory belongs to node {stored!r}, not {wanted!r} "
                f"({path}); give --node-id {stored} or another data directory"
            )
        return stored
    node_id = wanted or f"node-{uuid.uuid4().hex[:12]}"
    data_dir.mkdir(parents=True, exist_ok=True)
    (env or StorageEnv.default()).atomic_write(path, (node_id + "\n").encode())
    return node_id


class Membership:
    """A node's registration and its keepalive (see the module doc)."""

    def __init__(
        self,
        store: MetadataStore,
        prefix: str,
        record: NodeRecord,
        *,
        ttl: int = 10,
        disk_keeps_up: Callable[[float], bool] = lambda _limit: True,
        on_registered: Callable[[int], None] = lambda _incarnation: None,
        on_lost: Callable[[str], None] = lambda _why: None,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.record = record  # its incarnation is filled in at each registration
        self.ttl = ttl
        self._disk_keeps_up = disk_keeps_up
        self._on_registered = on_registered
        self._on_lost = on_lost
        self.incarnation = 0  # 0: not registered now
        self.registered = trio.Event()  # set at the first registration
        self.renewed_at = -float("inf")  # Trio's clock at the last successful renewal

    @property
    def node_id(self) -> str:
        return self.record.node

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, keep the lease alive, register again when it is lost; for ever."""
        task_status.started()
        while True:
            try:
                await self._register()
            except MetadataError as exc:
                log.warning("node %s: cannot register: %s", self.node_id, exc)
                await trio.sleep(RETRY_SECONDS)
                continue
            why = await self._keep_alive()
            self._lost(why)

    async def _register(self) -> None:
        # A stuck disk: no registration, so no leaderships for this node (polled: a flusher
        # says nothing when it is stuck, which is the point).
        while not self._disk_keeps_up(self.ttl / 2):  # noqa: ASYNC110
            await trio.sleep(RETRY_SECONDS)
        key = node_key(self.prefix, self.node_id)
        found = await self.store.get(key)
        for kv in found.kvs:
            try:
                old = NodeRecord.decode(kv.value)
            except RecordError:
                old = None
            if kv.lease:
                log.info(
                    "node %s: taking over the record of its previous run (incarnation %s)",
                    self.node_id,
                    old.incarnation if old is not None else kv.lease,
                )
                await self.store.revoke(kv.lease)
        lease = await self.store.grant_lease(self.ttl)
        record = attrs.evolve(self.record, node=self.node_id, incarnation=lease.id)
        result = await self.store.txn(
            [Compare.absent(key)], [Put(key, record.encode(), lease=lease.id)], [Get(key)]
        )
        if not result.succeeded:
            holder = result.responses[0]
            await self.store.revoke(lease.id)
            raise MetadataError(
                f"node id {self.node_id!r} is registered by another process: {_lease_of(holder)}"
            )
        self.record = record
        self.incarnation = lease.id
        self.renewed_at = trio.current_time()
        log.info("node %s: registered (incarnation %x)", self.node_id, lease.id)
        self.registered.set()
        self._on_registered(lease.id)

    async def _keep_alive(self) -> str:
        """Renew every TTL/3 until the lease is lost; why it was."""
        interval = self.ttl / 3
        while True:
            await trio.sleep(interval)
            if not self._disk_keeps_up(self.ttl / 2):
                log.error(
                    "node %s: a flush has been pending for over %.1f s: lease renewals stop",
                    self.node_id,
                    self.ttl / 2,
                )
                return "the disk does not keep up"
            try:
                await self.store.keepalive(self.incarnation)
            except LeaseLost:
                return "the lease expired"
            except MetadataUnavailable as exc:
                if trio.current_time() - self.renewed_at >= self.ttl:
                    return f"no renewal for {self.ttl} s ({exc})"
                continue
            self.renewed_at = trio.current_time()

    def _lost(self, why: str) -> None:
        log.warning("node %s: lease %x lost: %s", self.node_id, self.incarnation, why)
        self.incarnation = 0
        self._on_lost(why)

    async def leave(self) -> None:
        """Give the lease up (a controlled shutdown's last step): the node's keys go now."""
        if self.incarnation:
            lease, self.incarnation = self.incarnation, 0
            try:
                await self.store.revoke(lease)
            except MetadataError as exc:
                log.warning("node %s: cannot revoke its lease: %s", self.node_id, exc)


def _lease_of(result: RangeResult | int | None) -> str:
    if isinstance(result, RangeResult) and result.kvs:
        return f"lease {result.kvs[0].lease:x}"
    return "a record that came back meanwhile"
