"""What a node is for each replicated partition it holds: its leader, a follower of another
node, or on standby (offline, or no leader yet), as the partition records in its view say.

Responsibilities:
- ``PartitionRoles.reconcile``: after every change of the view, each local partition named in a
  record gets the role the record gives this node: **leader** when the record names this node
  in its current incarnation as the leader of an online partition (a ``LeaderReplica`` at the
  record's epoch, its ISR the record's, its writes through the node's ``IsrWrites``);
  **follower** when another node leads (a ``FollowerReplica`` fetching from it); **standby**
  otherwise (appends refused, the high watermark held). A role changes only when the
  leader, the epoch or this node's incarnation does: a leader steps down first (its waiting
  confirms fail), and its successor starts from the high watermark it had reached;
- losing the lease (``lost``): every leader steps down at once (it may no longer confirm:
  another may be elected once the lease is gone);
- the replica reports: each local replica's identity (and whether it is intact: once a follower
  found its log damaged, or its log failed, it says so in every role after), bound to the
  node's lease, so the controller elects only replicas whose log is the one the ISR recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

import attrs
import trio

from ..broker.streams.partition import GroupFence, OffsetKind, Partition
from ..model import Message
from ..plugins.spec import Durability, GroupCommit
from .fetch import NOT_LEADER, FetchRequest, FetchResponse
from .follower import Fetch, FollowerReplica, damage_of
from .forwarding import Send
from .isr_writes import IsrWrites
from .leader import LeaderReplica, NotLeader
from .membership import Membership
from .metadata import MetadataError, MetadataStore
from .records import ONLINE, ReplicaReport, partition_path, replica_key
from .view import ClusterView, Name

log = logging.getLogger(__name__)

RETRY_SECONDS: Final = 0.5


@attrs.frozen
class ReplicationSettings:
    replica_lag: float = 10.0  # seconds a follower may lag before it leaves the ISR
    publish_timeout: float = 30.0  # seconds a publish waits for its ISR before its nack
    fetch_max_wait: float = 0.5
    fetch_max_bytes: int = 1 << 20


class Standby:
    """The gate of a partition nobody here leads or follows now: appends refused, the high
    watermark held where it was."""

    def __init__(self, key: str, high_watermark: int, why: str) -> None:
        self.key = key
        self.high_watermark = high_watermark
        self.why = why

    def refusal(self) -> OSError | None:
        return NotLeader(f"partition {self.key}: {self.why}")

    @property
    def commit(self) -> GroupCommit:
        raise NotLeader(f"partition {self.key}: {self.why}")

    def forward(self, messages: Sequence[Message]) -> list[Durability] | None:
        return None

    def offset_stored(
        self, kind: OffsetKind, name: str, offset: int, fence: GroupFence | None = None
    ) -> None:
        log.info("partition %s: a %s offset stored on standby (%s)", self.key, kind, self.why)


Role = LeaderReplica | FollowerReplica | Standby


@attrs.define(eq=False)
class _Held:
    partition: Partition
    role: Role
    signature: tuple[object, ...]
    scope: trio.CancelScope | None = None


class PartitionRoles:
    """One node's roles for its replicated partitions (see the module doc)."""

    def __init__(
        self,
        store: MetadataStore,
        view: ClusterView,
        membership: Membership,
        isr_writes: IsrWrites,
        *,
        local: Callable[[str, str], Partition | None],
        fetch_from: Callable[[str], Fetch],
        forward_to: Callable[[str], Send] | None = None,
        settings: ReplicationSettings | None = None,
    ) -> None:
        self.store = store
        self.view = view
        self.membership = membership
        self.isr_writes = isr_writes
        self._local = local  # the local partition of a stream queue (None: not declared here)
        self._fetch_from = fetch_from
        self._forward_to = forward_to  # None: a follower refuses publishes
        self.settings = settings or ReplicationSettings()
        self.held: dict[Name, _Held] = {}
        self._reported: dict[Name, ReplicaReport] = {}
        self._reported_incarnation = 0
        self.leaving = False  # a controlled shutdown: every replica here stays on standby
        self._nursery: trio.Nursery | None = None
        self._wakeup = trio.Event()

    @property
    def node_id(self) -> str:
        return self.membership.node_id

    def leader_of(self, path: str) -> LeaderReplica | None:
        """This node's leader replica of the partition named ``path`` (in a fetch)."""
        for name, held in self.held.items():
            if partition_path(*name) == path and isinstance(held.role, LeaderReplica):
                return held.role
        return None

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """Answer a follower's fetch (the node-to-node link's ``fetch``)."""
        leader = self.leader_of(request.partition)
        if leader is None:
            return FetchResponse(epoch=-1, high_watermark=0, log_start=0, error=NOT_LEADER)
        return await leader.fetch(request)

    # -- running -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                self.reconcile()
                await self._report()
                with trio.move_on_after(RETRY_SECONDS * 4):
                    await self.view.wait_changed()

    # -- ``broker.streams.StreamReplication``: the vhosts' stream partitions -----------------

    def opened(self, vhost: str, queue: str, partition: Partition) -> None:
        """A stream partition opened here: on standby until its record gives it a role, its
        readers held at its log start (a tail this node wrote before a restart may not be
        what the replicas agreed on: nothing is read until they say what is)."""
        partition.gate = Standby(
            partition_path(vhost, queue), partition.log_start_offset, "waiting for its leader"
        )
        self.view.changed.set()

    def closed(self, vhost: str, queue: str) -> None:
        held = self.held.pop((vhost, queue), None)
        if held is not None:
            self._stop(held)
        self._reported.pop((vhost, queue), None)

    def leave(self, why: str) -> None:
        """The node is shutting down: every leader steps down now, and no replica here leads
        or follows again (a follower that fetched on would rejoin an ISR it is leaving)."""
        self.leaving = True
        self.lost(why)
        self.reconcile()

    def lost(self, why: str) -> None:
        """The node's lease is gone: every leader steps down now."""
        for name, held in self.held.items():
            if isinstance(held.role, LeaderReplica):
                self._replace(
                    name,
                    held.partition,
                    Standby(held.role.key, held.role.high_watermark, why),
                    ("standby",),
                )

    # -- the roles -------------------------------------------------------------------------

    def reconcile(self) -> None:
        incarnation = self.membership.incarnation
        seen: set[Name] = set()
        for name, (record, _mod) in self.view.partitions.items():
            if self.node_id not in record.replicas:
                continue
            partition = self._local(*name)
            if partition is None:
                continue
            seen.add(name)
            path = partition_path(*name)
            if self.leaving or record.state != ONLINE or record.leader is None:
                signature: tuple[object, ...] = ("standby", record.epoch)
            elif record.leader == self.node_id:
                if incarnation and record.leader_incarnation == incarnation:
                    signature = ("lead", record.epoch, incarnation)
                else:
                    signature = ("standby", record.epoch)  # elected in an earlier registration
            else:
                signature = ("follow", record.leader, record.epoch)
            held = self.held.get(name)
            if held is not None and held.signature == signature and held.partition is partition:
                continue
            high_watermark = partition.high_watermark
            role: Role
            if signature[0] == "lead":
                role = LeaderReplica(
                    path,
                    partition,
                    node_id=self.node_id,
                    epoch=record.epoch,
                    isr=record.isr,
                    min_isr=record.min_isr,
                    writer=self.isr_writes,
                    high_watermark=high_watermark,
                    replica_lag=self.settings.replica_lag,
                    publish_timeout=self.settings.publish_timeout,
                )
            elif signature[0] == "follow":
                assert record.leader is not None
                role = FollowerReplica(
                    path,
                    partition,
                    node_id=self.node_id,
                    leader=record.leader,
                    epoch=record.epoch,
                    fetch=self._fetch_from(record.leader),
                    high_watermark=high_watermark,
                    max_bytes=self.settings.fetch_max_bytes,
                    max_wait=self.settings.fetch_max_wait,
                    forward=None if self._forward_to is None else self._forward_to(record.leader),
                )
            else:
                why = "the node is shutting down" if self.leaving else "no leader now"
                role = Standby(path, high_watermark, why)
            self._replace(name, partition, role, signature)
        for name in [n for n in self.held if n not in seen]:
            held = self.held.pop(name)
            self._stop(held)
            held.partition.gate = Standby(
                held.role.key, held.partition.high_watermark, "not a replica here"
            )

    def _replace(
        self, name: Name, partition: Partition, role: Role, signature: tuple[object, ...]
    ) -> None:
        held = self.held.get(name)
        if held is not None:
            self._stop(held)
        new = self.held[name] = _Held(partition, role, signature)
        if isinstance(role, Standby):
            partition.gate = role
            partition.wake()
            return
        # A follower begins at once, unless the log is changing: a truncation or an epoch's
        # checkpoint under way (the task that began it cancelled, the change shielded) ends
        # first, and a leader's epoch is begun durably (in a worker thread) before it takes
        # appends. Meanwhile the partition is on standby.
        ready = isinstance(role, FollowerReplica) and not partition.changing
        if ready:
            role.begin()
        else:
            partition.gate = Standby(role.key, partition.high_watermark, "its role is beginning")
        assert self._nursery is not None
        new.scope = trio.CancelScope()
        self._nursery.start_soon(self._run_role, new, ready)

    async def _run_role(self, held: _Held, ready: bool) -> None:
        assert held.scope is not None
        with held.scope:
            role = held.role
            assert not isinstance(role, Standby)
            if not ready:
                await held.partition.settled()
                if isinstance(role, LeaderReplica):
                    await role.begin_epoch()
                if held.scope.cancel_called:  # replaced meanwhile: the next role's gate stands
                    return
                role.begin()
            await role.run()

    @staticmethod
    def _stop(held: _Held) -> None:
        if isinstance(held.role, LeaderReplica):
            held.role.resign("leadership moved")
        if held.scope is not None:
            held.scope.cancel()

    # -- replica reports -----------------------------------------------------------------------

    async def _report(self) -> None:
        incarnation = self.membership.incarnation
        if not incarnation:
            return
        if incarnation != self._reported_incarnation:
            self._reported.clear()
            self._reported_incarnation = incarnation
        for name, held in list(self.held.items()):
            intact = damage_of(held.partition) is None
            report = ReplicaReport(held.partition.replica_id, intact)
            if self._reported.get(name) == report:
                continue
            key = replica_key(self.view.prefix, self.node_id, *name)
            try:
                await self.store.put(key, report.encode(), lease=incarnation)
            except MetadataError as exc:
                log.warning("replica report %s: %s", key, exc)
                return
            self._reported[name] = report
