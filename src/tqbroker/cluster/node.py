"""A broker as a cluster node: the pieces of ``tqbroker.cluster`` put together around one
``Broker`` (§4 of ``shared/reference/scaleout.md``).

What runs, in the node's nursery (beside the broker's own tasks):
- the cluster view (``view.py``), listed before anything else starts;
- the membership (``membership.py``): registration under a lease, keepalive while the broker's
  flushers keep up;
- the controller's campaign (``controller.py``), on every node: one of them wins;
- the node's ISR writes (``isr_writes.py``) and partition roles (``roles.py``), which gate every
  stream partition of the broker (``Broker.replication``, set before the broker starts);
- the node-to-node link is given as ``fetch_from`` (a follower's fetch from another node) and
  served by the caller through ``roles.fetch``: the real link (``peer_link.py``) in a process,
  memory streams in the simulation.

Losing the lease makes every leader here step down at once; the node keeps running and
registers again (it never exits for etcd's sake).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Final

import attrs
import trio

from ..broker.broker import Broker
from ..broker.streams.partition import Partition
from ..broker.streams.service import partition_of
from .controller import Controller
from .follower import Fetch
from .isr_writes import IsrWrites
from .membership import Membership, load_node_id
from .metadata import Compare, Get, MetadataStore, Put, RangeResult
from .placement import SPREAD, Policy
from .records import DEFAULT_PREFIX, NodeRecord, secret_key
from .roles import PartitionRoles, ReplicationSettings
from .view import ClusterView

log = logging.getLogger(__name__)

SECRET_BYTES: Final = 32


@attrs.frozen
class ClusterSettings:
    node_id: str | None = None  # None: the data directory's (a new one on first start)
    prefix: str = DEFAULT_PREFIX
    lease_ttl: int = 10  # seconds
    placement: Policy = SPREAD
    replication: ReplicationSettings = attrs.field(factory=ReplicationSettings)
    amqp: str = ""  # the addresses this node advertises
    http: str = ""
    peer: str = ""


class ClusterNode:
    """One broker's membership of a cluster (see the module doc)."""

    def __init__(
        self,
        broker: Broker,
        store: MetadataStore,
        settings: ClusterSettings,
        *,
        fetch_from: Callable[[str], Fetch],
    ) -> None:
        self.broker = broker
        self.store = store
        self.settings = settings
        self.node_id = load_node_id(broker.config.data_dir, settings.node_id)
        self.view = ClusterView(store, settings.prefix)
        record = NodeRecord(
            node=self.node_id,
            incarnation=0,
            amqp=settings.amqp,
            http=settings.http,
            peer=settings.peer,
        )
        self.membership = Membership(
            store,
            settings.prefix,
            record,
            ttl=settings.lease_ttl,
            disk_keeps_up=self._disk_keeps_up,
            on_lost=self._lease_lost,
        )
        self.isr_writes = IsrWrites(store, self.view, lambda: self.membership.incarnation)
        self.roles = PartitionRoles(
            store,
            self.view,
            self.membership,
            self.isr_writes,
            local=self._local_partition,
            fetch_from=fetch_from,
            settings=settings.replication,
        )
        self.controller = Controller(store, self.view, self.membership, policy=settings.placement)
        self.secret = b""
        broker.replication = self.roles  # before the broker opens any stream

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join the cluster and stay in it until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.view.run)
            self.secret = await cluster_secret(self.store, self.settings.prefix)
            await nursery.start(self.roles.run)
            await nursery.start(self.isr_writes.run)
            await nursery.start(self.membership.run)
            await nursery.start(self.controller.run)
            task_status.started()

    def _local_partition(self, vhost: str, queue: str) -> Partition | None:
        found = self.broker.vhosts.get(vhost)
        if found is None:
            return None
        stream = found.queues.get(queue)
        return partition_of(stream) if stream is not None else None

    def _disk_keeps_up(self, limit: float) -> bool:
        now = trio.current_time()
        for flusher in self.broker.flushers.values():
            if flusher.busy_since is not None and now - flusher.busy_since > limit:
                return False
        return True

    def _lease_lost(self, why: str) -> None:
        self.roles.lost(why)


async def cluster_secret(store: MetadataStore, prefix: str) -> bytes:
    """The cluster's secret (the node-to-node link's key): created by the first node to ask,
    the same for every node after."""
    key = secret_key(prefix)
    result = await store.txn(
        [Compare.absent(key)],
        [Put(key, secrets.token_bytes(SECRET_BYTES)), Get(key)],
        [Get(key)],
    )
    found = result.responses[-1]
    if not isinstance(found, RangeResult) or not found.kvs:  # deleted in between: ask again
        return await cluster_secret(store, prefix)
    return found.kvs[0].value
