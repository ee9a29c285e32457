"""A broker as a cluster node: the pieces of ``tqbroker.cluster`` put together around one
``Broker`` (§4 of ``shared/reference/scaleout.md``).

What runs, in the node's nursery (beside the broker's own tasks):
- the cluster view (``view.py``), listed before anything else starts;
- the definitions catalog (``catalog.py``): the node has the cluster's definitions (and the
  cluster this node's) before ``run`` reports it started;
- the membership (``membership.py``): registration under a lease, keepalive while the broker's
  flushers keep up;
- the controller's campaign (``controller.py``), on every node: one of them wins;
- the node's ISR writes (``isr_writes.py``) and partition roles (``roles.py``), which gate every
  stream partition of the broker (``Broker.replication``, set before the broker starts);
- its part in the consumer groups (``groups.py``: ``Broker.group_coordination``);
- the node-to-node link (``peers.py``): a listener other nodes fetch from (``peer_port``),
  and a client per node; or, in the simulation, the caller's ``fetch_from`` (memory streams,
  calls it can cut), served through ``roles.fetch``.

Losing the lease makes every leader here step down at once; the node keeps running and
registers again (it never exits for etcd's sake). ``leave`` is the controlled shutdown (on
SIGTERM): leaders step down and the lease is revoked, so the others take over at once.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Callable
from typing import Any, Final

import attrs
import trio

from ..broker.broker import Broker
from ..broker.streams.partition import Partition
from ..broker.streams.service import partition_of
from .catalog import Catalog
from .controller import Controller
from .fetch import FetchRequest
from .follower import Fetch
from .forwarding import APPEND, OFFSETS, Send, decode_messages, take_forwarded, take_offsets
from .groups import ClusterGroups
from .isr_writes import IsrWrites
from .membership import Membership, load_node_id
from .metadata import Compare, Get, MetadataStore, Put, RangeResult
from .peer_link import LinkSettings, PeerError, PeerLinkError
from .peers import FETCH, PeerLinks, join_address
from .placement import SPREAD, Policy
from .records import (
    DEFAULT_PREFIX,
    ONLINE,
    NodeRecord,
    parse_partition_path,
    partition_path,
    secret_key,
)
from .roles import PartitionRoles, ReplicationSettings
from .view import ClusterView

log = logging.getLogger(__name__)

SECRET_BYTES: Final = 32
STATS: Final = "stats"  # the link's operation: what the management API shows of a node
STATS_SECONDS: Final = 2.0  # another node's stats wait this long at most
LEAVE_SECONDS: Final = 10.0  # a controlled shutdown waits this long for the new leaders


@attrs.frozen
class ClusterSettings:
    node_id: str | None = None  # None: the data directory's (a new one on first start)
    prefix: str = DEFAULT_PREFIX
    lease_ttl: int = 10  # seconds
    placement: Policy = SPREAD
    leader_rebalance_interval: float = 300.0  # seconds (0: leaders stay where they are)
    replication: ReplicationSettings = attrs.field(factory=ReplicationSettings)
    # The node-to-node listener (None: no listener, the caller links the nodes: the
    # simulation) and the host (and port, None: the listener's) other nodes reach it on.
    peer_host: str = "127.0.0.1"
    peer_port: int | None = None
    advertise_host: str = "127.0.0.1"
    advertise_peer_port: int | None = None
    link: LinkSettings = attrs.field(factory=LinkSettings)


class ClusterNode:
    """One broker's membership of a cluster (see the module doc)."""

    def __init__(
        self,
        broker: Broker,
        store: MetadataStore,
        settings: ClusterSettings,
        *,
        fetch_from: Callable[[str], Fetch] | None = None,
        forward_to: Callable[[str], Send] | None = None,
    ) -> None:
        self.broker = broker
        self.store = store
        self.settings = settings
        self.node_id = load_node_id(broker.config.data_dir, settings.node_id, broker.env)
        self.view = ClusterView(store, settings.prefix)
        self.links = PeerLinks(self.node_id, self.view, settings.link)
        record = NodeRecord(node=self.node_id, incarnation=0)
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
            fetch_from=fetch_from or self.links.fetch_from,
            forward_to=forward_to or self.links.forward_to,
            settings=settings.replication,
        )
        self.controller = Controller(
            store,
            self.view,
            self.membership,
            policy=settings.placement,
            leader_rebalance_interval=settings.leader_rebalance_interval,
        )
        self.catalog = Catalog(broker, store, self.view)
        self.groups = ClusterGroups(broker, store, self.view, self.membership)
        broker.group_coordination = self.groups
        self.secret = b""
        # What ``/api/nodes`` shows of this node, for the others (set by the server).
        self.stats: Callable[[], dict[str, Any]] = dict
        self._advertised = trio.Event()
        self._registration = trio.CancelScope()  # the membership and the controller's campaign
        broker.replication = self.roles  # before the broker opens any stream

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Catch up with the cluster (``task_status.started()`` then: serve clients), register
        once ``advertise`` has said where clients reach this node, and stay until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.view.run)
            self.secret = self.links.secret = await cluster_secret(self.store, self.settings.prefix)
            if self.settings.peer_port is not None:
                port = await nursery.start(
                    self.links.serve,
                    self.settings.peer_host,
                    self.settings.peer_port,
                    {
                        FETCH: self._fetch,
                        APPEND: self.take_forwarded,
                        OFFSETS: self.take_offsets,
                        STATS: self._stats,
                    },
                )
                if self.settings.advertise_peer_port is not None:
                    port = self.settings.advertise_peer_port
                self.membership.record = attrs.evolve(
                    self.membership.record, peer=join_address(self.settings.advertise_host, port)
                )
            await nursery.start(self.catalog.run)  # caught up with the cluster's definitions
            await nursery.start(self.roles.run)
            await nursery.start(self.isr_writes.run)
            await nursery.start(self.groups.run)
            task_status.started()
            await self._advertised.wait()
            with self._registration:
                async with trio.open_nursery() as registered:
                    await registered.start(self.membership.run)
                    await registered.start(self.controller.run)

    async def leave(self) -> None:
        """A controlled shutdown: this node's leaders step down (their unconfirmed publishes
        are nacked), its lease goes (the controller elects other in-sync replicas at once, not
        after a TTL), and it waits up to ``LEAVE_SECONDS`` for the view to show none led here."""
        self._registration.cancel()
        self.roles.leave("the node is shutting down")
        await self.membership.leave()
        with trio.move_on_after(LEAVE_SECONDS):
            while self.leading():
                await self.view.wait_changed()
        still = self.leading()
        if still:
            log.warning("node %s: left still leading %s", self.node_id, ", ".join(still))
        else:
            log.info("node %s: left the cluster; its partitions are led elsewhere", self.node_id)

    def leading(self) -> list[str]:
        """The partitions the view says this node leads (online ones)."""
        return [
            partition_path(*name)
            for name, (record, _revision) in self.view.partitions.items()
            if record.leader == self.node_id and record.state == ONLINE
        ]

    def advertise(self, *, amqp: str = "", http: str = "", kafka: str = "") -> None:
        """Where clients reach this node (``host:port`` of AMQP and Kafka, the HTTP API's base
        URL): the node registers, with them in its record."""
        record = self.membership.record
        self.membership.record = attrs.evolve(record, amqp=amqp, http=http, kafka=kafka)
        self._advertised.set()

    async def _stats(self, peer: str, body: Any) -> Any:
        return self.stats()

    async def stats_of(self, node: str) -> dict[str, Any] | None:
        """Another node's stats over the link (None: it does not answer in time)."""
        with trio.move_on_after(STATS_SECONDS):
            try:
                found = await self.links.forward_to(node)(STATS, {})
            except (PeerLinkError, OSError, KeyError, trio.TooSlowError) as exc:
                log.debug("node %s: no stats from %s: %s", self.node_id, node, exc)
                return None
            return dict(found) if isinstance(found, dict) else None
        return None

    def known_nodes(self) -> set[str]:
        """Every node the cluster knows of: registered, or a partition's replica (a node that
        is down is still a member)."""
        replicas = {n for record, _mod in self.view.partitions.values() for n in record.replicas}
        return set(self.view.nodes) | replicas

    async def _fetch(self, peer: str, body: Any) -> Any:
        request = FetchRequest.decode(body)
        if request.follower != peer:
            raise PeerError("wrong_follower", f"node {peer} fetched as {request.follower}")
        return (await self.roles.fetch(request)).encode()

    async def take_forwarded(self, peer: str, body: Any) -> Any:
        """A publish forwarded here by ``peer``: appended if this node leads its partition."""
        vhost, queue = parse_partition_path(str(body["partition"]))
        found = self.broker.vhosts.get(vhost)
        stream = found.queues.get(queue) if found is not None else None
        if stream is None or partition_of(stream) is None:
            return {"taken": 0, "error": f"no stream {body['partition']} on node {self.node_id}"}
        return await take_forwarded(stream.publish_run, decode_messages(body["messages"]))

    async def take_offsets(self, peer: str, body: Any) -> Any:
        """Consumers' offsets stored on ``peer``, a follower of a partition led here."""
        vhost, queue = parse_partition_path(str(body["partition"]))
        partition = self._local_partition(vhost, queue)
        if partition is None:
            raise PeerError("unknown_partition", f"no stream {body['partition']} here")
        refused = take_offsets(
            partition, body, functools.partial(self.groups.refuses, vhost, queue)
        )
        if refused:
            log.info("%s: stale commits of %s refused (a later generation)", queue, refused)
        return None

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
