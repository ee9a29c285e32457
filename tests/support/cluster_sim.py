"""An in-process cluster for tests: brokers in one Trio run, each with its own data directory,
one ``FakeEtcd`` between them and direct calls for the node-to-node link (fetches and forwarded
publishes), which the test can cut per node (``Cluster.cut``). ``cluster(tmp_path)`` starts
three; ``kill`` stops one (its lease stays until its TTL runs out), ``start`` brings it back on
its data directory. With ``disks=True`` every node writes through a ``SimDisk`` of its own
(``sim_disk``): ``power_cut_now`` takes every node down at once and ``restore_power`` restarts
them on what their disks had made durable; a disk can stall (``disks[name].stall()``: its
fsyncs block)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.support.polling import eventually_async
from tests.support.sim_disk import SimDisk
from tqbroker.broker.broker import Broker
from tqbroker.broker.declaring import open_and_declare_queue
from tqbroker.broker.streams.partition import Partition
from tqbroker.broker.streams.service import partition_of
from tqbroker.cluster.fetch import FetchRequest, FetchResponse
from tqbroker.cluster.follower import Fetch
from tqbroker.cluster.forwarding import APPEND, Send
from tqbroker.cluster.leader import LeaderReplica
from tqbroker.cluster.node import ClusterNode, ClusterSettings
from tqbroker.cluster.records import PartitionRecord, partition_key
from tqbroker.cluster.roles import ReplicationSettings
from tqbroker.config import BrokerConfig
from tqbroker.model import Message
from tqbroker.storage_env import StorageEnv
from tqbroker.testing.fake_etcd import FakeEtcd

STREAM = {"x-queue-type": "stream"}


@attrs.define
class Member:
    broker: Broker
    node: ClusterNode
    scope: trio.CancelScope

    def partition(self, queue: str = "s") -> Partition:
        found = partition_of(self.broker.vhosts["/"].queues[queue])
        assert found is not None
        return found


class Cluster:
    def __init__(
        self, tmp_path: Path, etcd: FakeEtcd, nursery: trio.Nursery, *, disks: bool = False
    ) -> None:
        self.tmp_path = tmp_path
        self.etcd = etcd
        self.nursery = nursery
        self.with_disks = disks
        self.disks: dict[str, SimDisk] = {}  # with ``disks``: each node's, by name
        self.members: dict[str, Member] = {}
        self.cut: set[str] = set()  # nodes cut off from the others (fetches, forwards)
        self._stopped: dict[str, trio.Event] = {}  # set when a node's run has ended
        self._cut_points: dict[str, int] = {}  # each disk's crash point at a power cut

    def flushing(self) -> bool:
        """A flush runs in a worker thread on some live node (``SimClock.busy``)."""
        return any(
            flusher.busy_since is not None
            for member in self.members.values()
            for flusher in [*member.broker.flushers.values(), member.broker.definitions_flusher]
        )

    def fetch_from(self, target: str) -> Fetch:
        async def fetch(request: FetchRequest) -> FetchResponse:
            if target in self.cut or request.follower in self.cut or target not in self.members:
                await trio.sleep(0.05)
                raise ConnectionError(f"no link to {target}")
            return await self.members[target].node.roles.fetch(request)

        return fetch

    def forward_to(self, source: str, target: str) -> Send:
        async def send(op: str, body: Any) -> Any:
            if target in self.cut or source in self.cut or target not in self.members:
                await trio.sleep(0.05)
                raise ConnectionError(f"no link to {target}")
            node = self.members[target].node
            take = node.take_forwarded if op == APPEND else node.take_offsets
            return await take("?", body)

        return send

    async def start(self, name: str) -> Member:
        stopped = self._stopped.get(name)
        if stopped is not None:  # its previous run lets its data directory go first
            await stopped.wait()
        data_dir = self.tmp_path / name
        env = None
        if self.with_disks:
            if name not in self.disks:
                data_dir.mkdir(parents=True)
                self.disks[name] = SimDisk(data_dir)
            env = StorageEnv.default(self.disks[name])
        config = BrokerConfig(port=0, http_port=None, data_dir=data_dir)
        broker = Broker(config, env)
        settings = ClusterSettings(
            node_id=name,
            lease_ttl=3,
            replication=ReplicationSettings(replica_lag=1.0, publish_timeout=10.0),
        )
        node = ClusterNode(
            broker,
            self.etcd.client(),
            settings,
            fetch_from=self.fetch_from,
            forward_to=functools.partial(self.forward_to, name),
        )
        scope = trio.CancelScope()
        started = trio.Event()
        stopped = self._stopped[name] = trio.Event()

        async def run() -> None:
            try:
                with scope:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(broker.run)
                        await nursery.start(node.run)
                        node.advertise()
                        started.set()
            finally:
                stopped.set()

        self.nursery.start_soon(run)
        await started.wait()
        member = self.members[name] = Member(broker, node, scope)
        return member

    def kill(self, name: str) -> None:
        """The process dies: its tasks stop; its lease stays until its TTL runs out."""
        member = self.members.pop(name)
        member.scope.cancel()

    async def wait_stopped(self, name: str) -> None:
        """Until the node's last run has ended (its files closed)."""
        await self._stopped[name].wait()

    def segment_files(self, name: str) -> list[Path]:
        """The node's log segment files of its one stream, oldest first."""
        found = sorted((self.tmp_path / name).glob("log/*/*.log"))
        assert len({path.parent for path in found}) == 1, found
        return found

    def power_cut_now(self) -> list[str]:
        """The power goes on every node at once (with ``disks``): what each disk holds from now
        on is fixed (``SimDisk.crash_point``) and the running nodes stop (returned, for
        ``restore_power``). Synchronous, so that the caller can end its clients in the same
        step: no outcome a client saw was decided after the power went."""
        self._cut_points = {name: disk.crash_point() for name, disk in self.disks.items()}
        running = sorted(self.members)
        for name in running:
            self.kill(name)
        return running

    async def restore_power(self, restart: list[str], variant: str = "synced") -> None:
        """Once every node has stopped: each data directory becomes what the power cut left it
        (``SimDisk.after_power_cut``, in ``variant``), and the nodes in ``restart`` start on it."""
        points, self._cut_points = self._cut_points, {}
        for name in points:
            stopped = self._stopped.get(name)
            if stopped is not None:
                await stopped.wait()
        for name, point in points.items():
            self.disks[name] = self.disks[name].after_power_cut(point, variant)
        for name in restart:
            await self.start(name)

    def record(self, queue: str = "s") -> PartitionRecord | None:
        for member in self.members.values():
            found = member.node.view.partitions.get(("/", queue))
            if found is not None:
                return found[0]
        return None

    async def watch_records(
        self,
        into: list[PartitionRecord],
        queue: str = "s",
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Every version of the stream's partition record etcd holds from now on, appended to
        ``into`` in order, until cancelled (a history of its leaders and ISRs, whoever is up)."""
        key = partition_key(ClusterSettings().prefix, "/", queue)
        async with self.etcd.client().watch(key) as events:
            task_status.started()
            async for batch in events:
                into.extend(PartitionRecord.decode(e.kv.value) for e in batch if e.kind == "put")

    def leader(self, queue: str = "s") -> LeaderReplica | None:
        for member in self.members.values():
            leader = member.node.roles.leader_of(f"%2F/{queue}")
            if leader is not None and leader.resigned is None:
                return leader
        return None


@asynccontextmanager
async def cluster(tmp_path: Path, nodes: int = 3, *, disks: bool = False) -> AsyncIterator[Cluster]:
    etcd = FakeEtcd()
    async with trio.open_nursery() as nursery:
        await nursery.start(etcd.run)
        made = Cluster(tmp_path, etcd, nursery, disks=disks)
        try:
            for n in range(nodes):
                await made.start(f"n{n}")
            yield made
        finally:
            for disk in made.disks.values():  # a stalled fsync would hold the shutdown up
                disk.unstall()
            nursery.cancel_scope.cancel()


async def declare_stream(made: Cluster, queue: str = "s", **arguments: object) -> None:
    """The stream declared on one node; the catalog takes it to every other."""
    member = next(iter(made.members.values()))
    await open_and_declare_queue(
        member.broker.vhosts["/"],
        queue,
        passive=False,
        durable=True,
        exclusive=False,
        auto_delete=False,
        arguments={**STREAM, **arguments},  # type: ignore[dict-item]
        owner=None,
    )
    await settled(
        made, lambda: all(queue in m.broker.vhosts["/"].queues for m in made.members.values())
    )


async def append(leader: LeaderReplica, payloads: list[bytes]) -> bool:
    _first, durabilities, error = leader.partition.append(
        [Message("", "k", b"", p) for p in payloads]
    )
    assert error is None, error
    commit, ticket = durabilities[-1]  # type: ignore[misc]
    with trio.fail_after(15):
        return await commit.wait(ticket)


async def settled(made: Cluster, check: Callable[[], bool]) -> None:
    await eventually_async(check, timeout=20)
