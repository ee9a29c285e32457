"""A leader and its followers over real log backends and real flushers, in one Trio run, the
fetch a direct call (the node-to-node link is tested on its own): confirms wait for every
in-sync replica's fsync, the high watermark and what readers see, the ISR's shrink and expand
(committed before use), min-ISR refusals, divergence and truncation, a replica whose identity
changed. The rules are Kafka's (KIP-101, KIP-320, KIP-966) as ``shared/reference/scaleout.md``
§4.4 states them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
import trio

from tests.support.polling import eventually_async
from tqbroker.backends.log import LogBackend
from tqbroker.broker.flusher import Flusher
from tqbroker.broker.streams.partition import Partition
from tqbroker.cluster.fetch import FetchRequest, FetchResponse
from tqbroker.cluster.follower import FollowerReplica
from tqbroker.cluster.leader import LeaderReplica, NotEnoughReplicas, NotLeader
from tqbroker.model import Message


def message(n: int) -> Message:
    return Message("", "k", b"", b"record-%04d" % n)


class Replica:
    """One node's copy of the partition: its own backend, flusher and data directory."""

    def __init__(self, directory: Path, node: str, segment_bytes: int = 64 << 20) -> None:
        self.node = node
        self.directory = directory
        self.backend = LogBackend(segment_bytes=segment_bytes)
        self.backend.open(directory)
        self.flusher = Flusher(self.backend)
        self.partition = Partition(self.backend.open_stream("/", "s"), self.flusher)

    def frames(self, start: int = 0) -> list[bytes]:
        partition = self.partition
        frames, _next = partition.replica_frames(start, partition.durable_end, 1 << 30)
        return [head + rest for head, rest in frames]

    def close(self) -> None:
        self.backend.close()


class Writer:
    """The ISR writes a leader makes (an etcd CAS in a cluster): taken, or fenced."""

    def __init__(self) -> None:
        self.writes: list[dict[str, str]] = []
        self.fenced = False
        self.gate = trio.Event()  # cleared: writes wait (etcd slow or down)
        self.gate.set()

    async def write_isr(self, leader: LeaderReplica, isr: Mapping[str, str]) -> bool:
        await self.gate.wait()
        if self.fenced:
            return False
        self.writes.append(dict(isr))
        return True


class Link:
    """The fetch from a follower to its leader, which a test can cut."""

    def __init__(self, leader: LeaderReplica) -> None:
        self.leader = leader
        self.cut = False

    async def __call__(self, request: FetchRequest) -> FetchResponse:
        if self.cut:
            await trio.sleep(0.05)
            raise ConnectionError("link cut")
        return await self.leader.fetch(request)


@contextmanager
def replicas(tmp_path: Path, *nodes: str) -> Iterator[list[Replica]]:
    made = [Replica(tmp_path / node, node) for node in nodes]
    try:
        yield made
    finally:
        for replica in made:
            replica.close()


@asynccontextmanager
async def cluster(
    tmp_path: Path, *, min_isr: int = 2, replica_lag: float = 1.0, nodes: int = 3
) -> AsyncIterator[tuple[list[Replica], LeaderReplica, list[FollowerReplica], list[Link], Writer]]:
    names = [f"n{i}" for i in range(nodes)]
    with replicas(tmp_path, *names) as made:
        async with trio.open_nursery() as nursery:
            for replica in made:
                await nursery.start(replica.flusher.run)
            writer = Writer()
            isr = {r.node: r.partition.replica_id for r in made}
            leader = LeaderReplica(
                "/ s",
                made[0].partition,
                node_id="n0",
                epoch=1,
                isr=isr,
                min_isr=min_isr,
                writer=writer,
                replica_lag=replica_lag,
                publish_timeout=5.0,
            )
            await leader.begin_epoch()
            leader.begin()
            await nursery.start(leader.run)
            links, followers = [], []
            for replica in made[1:]:
                link = Link(leader)
                follower = FollowerReplica(
                    "/ s",
                    replica.partition,
                    node_id=replica.node,
                    leader="n0",
                    epoch=1,
                    fetch=link,
                    max_wait=0.2,
                )
                follower.begin()
                nursery.start_soon(follower.run)
                links.append(link)
                followers.append(follower)
            yield made, leader, followers, links, writer
            nursery.cancel_scope.cancel()


async def published(leader: LeaderReplica, count: int, start: int = 0) -> tuple[int, bool]:
    """Append ``count`` messages through the leader's partition; (first offset, confirmed)."""
    first, durabilities, error = leader.partition.append(
        [message(n) for n in range(start, start + count)]
    )
    assert error is None
    commit, ticket = durabilities[-1]  # type: ignore[misc]
    with trio.fail_after(10):
        return first, await commit.wait(ticket)


async def test_a_confirm_waits_for_every_in_sync_replica_and_copies_are_identical(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (made, leader, _followers, _links, _writer):
        first, confirmed = await published(leader, 500)
        assert (first, confirmed) == (0, True)
        # Confirmed means durable on every member: their durable ends are past it.
        for replica in made:
            assert replica.partition.durable_end >= 500, replica.node
        assert leader.high_watermark == 500
        for replica in made[1:]:
            assert replica.frames() == made[0].frames()  # never re-batched
            assert replica.partition.epoch_history == made[0].partition.epoch_history
        # Followers' readers see up to the high watermark the leader sent them.
        await eventually_async(lambda: all(r.partition.high_watermark == 500 for r in made))
        records = made[2].partition.read_many(0, 1000)
        assert [r.offset for r in records] == list(range(500))


async def test_appends_on_a_follower_are_refused(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (made, _leader, _followers, _links, _writer):
        _first, durabilities, error = made[1].partition.append([message(0)])
        assert durabilities == []
        assert isinstance(error, NotLeader)


async def test_a_follower_that_stops_fetching_holds_the_high_watermark_until_the_isr_shrinks(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, min_isr=2, replica_lag=0.5) as (made, leader, _f, links, writer):
        await published(leader, 10)
        links[1].cut = True  # n2 is cut off
        _first, durabilities, _error = leader.partition.append([message(10)])
        commit, ticket = durabilities[0]  # type: ignore[misc]
        await trio.sleep(0.2)
        assert leader.high_watermark == 10  # n2 has not got it: no reader sees it yet
        assert commit.completed < ticket
        with trio.fail_after(5):
            assert await commit.wait(ticket)  # after the shrink was committed
        assert writer.writes[-1].keys() == {"n0", "n1"}
        assert leader.isr.keys() == {"n0", "n1"}
        assert leader.high_watermark == 11
        # n2 comes back: it catches up and rejoins the ISR (written first).
        links[1].cut = False
        await eventually_async(lambda: "n2" in leader.isr, timeout=10)
        assert writer.writes[-1].keys() == {"n0", "n1", "n2"}
        assert made[2].frames() == made[0].frames()


async def test_below_min_isr_appends_are_refused_and_waiting_confirms_fail(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, min_isr=3, replica_lag=0.5) as (_made, leader, _f, links, _w):
        await published(leader, 5)
        links[0].cut = True
        _first, durabilities, _error = leader.partition.append([message(5)])
        commit, ticket = durabilities[0]  # type: ignore[misc]
        with trio.fail_after(5):
            assert not await commit.wait(ticket)  # nacked once the ISR fell below 3
        assert leader.high_watermark == 5  # and the high watermark stays
        _first, taken, error = leader.partition.append([message(6)])
        assert (taken, type(error)) == ([], NotEnoughReplicas)
        links[0].cut = False
        await eventually_async(lambda: len(leader.isr) == 3, timeout=10)
        assert leader.refusal() is None
        assert (await published(leader, 1, start=7))[1]


async def test_an_isr_shrink_is_used_only_once_committed(tmp_path: Path) -> None:
    async with cluster(tmp_path, min_isr=2, replica_lag=0.3) as (_made, leader, _f, links, writer):
        await published(leader, 3)
        writer.gate = trio.Event()  # etcd does not answer
        links[1].cut = True
        _first, durabilities, _error = leader.partition.append([message(3)])
        commit, ticket = durabilities[0]  # type: ignore[misc]
        await trio.sleep(1.0)  # well past replica_lag: the shrink is proposed, not committed
        assert leader.isr.keys() == {"n0", "n1", "n2"}
        assert leader.high_watermark == 3
        assert commit.completed < ticket
        writer.gate.set()
        with trio.fail_after(5):
            assert await commit.wait(ticket)


async def test_a_fenced_isr_write_makes_the_leader_step_down(tmp_path: Path) -> None:
    async with cluster(tmp_path, min_isr=2, replica_lag=0.3) as (_made, leader, _f, links, writer):
        await published(leader, 3)
        writer.fenced = True  # another controller or leader moved the partition on
        links[1].cut = True
        _first, durabilities, _error = leader.partition.append([message(3)])
        commit, ticket = durabilities[0]  # type: ignore[misc]
        with trio.fail_after(5):
            assert not await commit.wait(ticket)
        assert isinstance(leader.refusal(), NotLeader)


async def test_a_publish_times_out_when_the_isr_cannot_change(tmp_path: Path) -> None:
    async with cluster(tmp_path, min_isr=2, replica_lag=0.3) as (_made, leader, _f, links, writer):
        await published(leader, 3)
        writer.gate = trio.Event()  # etcd down: the ISR cannot shrink
        for link in links:
            link.cut = True
        _first, durabilities, _error = leader.partition.append([message(3)])
        commit, ticket = durabilities[0]  # type: ignore[misc]
        with trio.fail_after(10):
            assert not await commit.wait(ticket)  # nacked at publish_timeout (5 s here)


async def test_a_diverged_follower_cuts_its_log_back_to_the_leader_s(tmp_path: Path) -> None:
    """The old leader n1 took records at epoch 1 that never reached n0; n0 leads epoch 2 and
    takes others at the same offsets: n1, following, cuts back to where epoch 1 ended on n0."""
    with replicas(tmp_path, "n0", "n1") as (new, old):
        async with trio.open_nursery() as nursery:
            for replica in (new, old):
                await nursery.start(replica.flusher.run)
            writer = Writer()
            isr = {"n0": new.partition.replica_id, "n1": old.partition.replica_id}
            first = LeaderReplica(
                "/ s", old.partition, node_id="n1", epoch=1, isr=isr, min_isr=1, writer=writer
            )
            await first.begin_epoch()
            first.begin()
            follower = FollowerReplica(
                "/ s", new.partition, node_id="n0", leader="n1", epoch=1, fetch=first.fetch
            )
            follower.begin()
            old.partition.append([message(n) for n in range(10)])
            for _ in range(3):  # n0 copies offsets 0..9 of epoch 1
                await follower._apply(await first.fetch(follower._request()))
            assert new.partition.durable_end == 10
            old.partition.append([message(n) for n in range(10, 15)])  # never copied
            await old.flusher.wait(old.flusher.request())
            first.resign("n1 lost its lease")
            second = LeaderReplica(
                "/ s", new.partition, node_id="n0", epoch=2, isr=isr, min_isr=1, writer=writer
            )
            await second.begin_epoch()
            second.begin()
            assert new.partition.epoch_history == [(1, 0), (2, 10)]
            new.partition.append([Message("", "k", b"", b"new-%d" % n) for n in range(3)])
            await new.flusher.wait(new.flusher.request())
            demoted = FollowerReplica(
                "/ s", old.partition, node_id="n1", leader="n0", epoch=2, fetch=second.fetch
            )
            demoted.begin()
            nursery.start_soon(demoted.run)
            await eventually_async(lambda: old.partition.durable_end == 13)
            assert old.frames() == new.frames()
            assert old.partition.epoch_history == [(1, 0), (2, 10)]
            records = old.partition.replica_frames(10, 13, 1 << 20)[0]
            assert all(b"new-" in head + rest for head, rest in records)
            nursery.cancel_scope.cancel()


async def test_a_replica_under_a_new_identity_leaves_the_isr(tmp_path: Path) -> None:
    async with cluster(tmp_path, min_isr=1, replica_lag=5.0) as (made, leader, _followers, _l, w):
        await published(leader, 3)
        # n2's directory was lost and made anew: same node, another replica.
        leader.isr["n2"] = "an-older-replica-id"
        await published(leader, 1, start=3)
        # Its old self leaves; caught up under the new identity, it is in again, with the
        # new id written (one write: the swap).
        await eventually_async(lambda: leader.isr.get("n2") == made[2].partition.replica_id)
        assert w.writes[-1]["n2"] == made[2].partition.replica_id


@pytest.mark.parametrize("nodes", [1])
async def test_a_single_replica_confirms_at_its_own_fsync(tmp_path: Path, nodes: int) -> None:
    async with cluster(tmp_path, min_isr=1, nodes=nodes) as (made, leader, _f, _l, _w):
        _first, confirmed = await published(leader, 100)
        assert confirmed
        assert made[0].partition.high_watermark == 100


async def test_a_follower_behind_the_leader_s_log_start_continues_there(tmp_path: Path) -> None:
    """Retention on the leader removed records a follower lacks (it was down, or joins late):
    the leader answers ``offset_out_of_range`` (Kafka's ``OFFSET_OUT_OF_RANGE``), and the
    follower empties its log and continues at the leader's log start (Kafka's
    ``ReplicaFetcherThread`` then calls ``truncateFullyAndStartAt``); from there the two hold
    byte-identical frames and the follower's log starts where the leader's does."""
    lead, late = Replica(tmp_path / "n0", "n0", 4096), Replica(tmp_path / "n1", "n1", 4096)
    try:
        async with trio.open_nursery() as nursery:
            for replica in (lead, late):
                await nursery.start(replica.flusher.run)
            isr = {"n0": lead.partition.replica_id}
            leader = LeaderReplica(
                "/ s", lead.partition, node_id="n0", epoch=1, isr=isr, min_isr=1, writer=Writer()
            )
            await leader.begin_epoch()
            leader.begin()
            follower = FollowerReplica(
                "/ s", late.partition, node_id="n1", leader="n0", epoch=1, fetch=leader.fetch
            )
            follower.begin()
            lead.partition.append([message(n) for n in range(20)])
            await lead.flusher.wait(lead.flusher.request())
            for _ in range(3):  # n1 copies offsets 0..19, then goes away
                await follower._apply(await leader.fetch(follower._request()))
            assert late.partition.durable_end == 20
            for n in range(20, 400, 10):
                lead.partition.append([message(i) for i in range(n, n + 10)])
                await lead.flusher.wait(lead.flusher.request())
            removed = lead.partition.apply_retention(max_bytes=8192, max_age_ms=None, now_ms=0)
            await lead.flusher.wait(lead.flusher.request())
            start = lead.partition.log_start_offset
            assert removed > 0
            assert start > 20
            nursery.start_soon(follower.run)
            await eventually_async(lambda: late.partition.durable_end == 400)
            assert late.partition.log_start_offset == start
            assert late.frames(start) == lead.frames(start)
            assert late.partition.replica_id != lead.partition.replica_id
            nursery.cancel_scope.cancel()
    finally:
        lead.close()
        late.close()
