"""A stuck disk on the in-process three-node cluster (``cluster.md`` §C invariant 15: no node
keeps a live lease while its flusher is stalled; LavinMQ #2151's zombie leader).

Producers publish through every node; then the leader's disk hangs (``SimDisk.stall``: every
fsync blocks, writes still go through). Its lease must be gone within a bound (renewals stop
once a flush has been pending for TTL/2, then the lease runs out), and stay gone while the
disk is stuck (no registration again); its leadership must move to another in-sync replica;
and nothing appended to it after the stall is confirmed or counted durable (its durable end and
high watermark never pass its log's end at the stall: an fsync already under way then may
still finish). Once the disk is back, the node rejoins and the whole history must
pass the checker.

One seed runs by default (``TQBROKER_CLUSTER_SEED=N`` replays one); ``-m slow`` stalls a
random node (leader or follower) over more seeds.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from tests.support.cluster_history import CONFIRMED, History, check
from tests.support.cluster_sim import Cluster, cluster, declare_stream, settled
from tests.support.cluster_workload import in_sync, produce, seeds, take_replicas
from tests.support.polling import eventually_async

PRODUCERS = 3


def registered(made: Cluster, name: str) -> bool:
    """Every other live node sees ``name`` registered (its key in etcd, bound to a live
    lease; the views follow etcd's watch)."""
    views = [m.node.view for n, m in made.members.items() if n != name]
    assert views, "no other node to ask"
    return all(name in view.live for view in views)


async def run_stuck_disk(
    tmp_path: Path, seed: int, *, leader_only: bool
) -> tuple[History, list[str]]:
    """The run's history, and the fsyncs called on the event loop while the disk was stuck."""
    rng = random.Random(seed)
    history = History()
    async with cluster(tmp_path, disks=True) as made:
        await declare_stream(made)
        await settled(made, lambda: in_sync(made))
        ttl = made.members["n0"].node.settings.lease_ttl
        async with trio.open_nursery() as producers:
            for n in range(PRODUCERS):
                producers.start_soon(produce, made, history, f"p{n}", random.Random(rng.random()))
            await trio.sleep(rng.uniform(0.5, 1.5))
            leader = made.leader()
            assert leader is not None
            victim = leader.node_id if leader_only else rng.choice(sorted(made.members))
            partition = made.members[victim].partition()
            end_at_stall = partition.log_end_offset
            print(f"seed {seed}: {victim}'s disk stalls (leader {leader.node_id})")
            made.disks[victim].stall()
            stalled_at = trio.current_time()
            # Renewals stop after TTL/2 of a pending flush; the lease then lasts at most a TTL.
            await eventually_async(
                lambda: not registered(made, victim),
                timeout=ttl / 2 + ttl + 3,
                what=f"{victim}'s lease gone while its disk is stuck",
            )
            print(f"lease gone {trio.current_time() - stalled_at:.1f} s after the stall")
            await settled(
                made, lambda: (lead := made.leader()) is not None and lead.node_id != victim
            )
            # Stuck for another TTL: no registration again, no high watermark past the disk.
            await trio.sleep(ttl)
            assert made.disks[victim].stalled_syncs > 0, "nothing waited for the stuck disk"
            assert not registered(made, victim), f"{victim} registered on a stuck disk"
            assert partition.durable_end <= end_at_stall, (
                f"{victim}'s durable end {partition.durable_end} passed its log's end at the "
                f"stall, {end_at_stall}, on a stuck disk"
            )
            assert partition.high_watermark <= end_at_stall, (
                f"{victim} moved its high watermark to {partition.high_watermark} past its "
                f"log's end at the stall, {end_at_stall}"
            )
            loop_syncs = list(made.disks[victim].loop_syncs)
            made.disks[victim].unstall()
            await settled(made, lambda: registered(made, victim))
            await trio.sleep(1)
            producers.cancel_scope.cancel()
        await settled(made, lambda: in_sync(made))
        take_replicas(made, history)
    return history, loop_syncs


def assert_passes(history: History, seed: int) -> None:
    assert any(p.outcome == CONFIRMED for p in history.publishes), "nothing was confirmed"
    violations = check(history)
    assert violations == [], f"seed {seed} (TQBROKER_CLUSTER_SEED={seed} replays it)"


@pytest.mark.parametrize("seed", seeds(20261206))
async def test_a_stuck_disk_loses_the_lease_and_the_lead_and_never_blocks_the_event_loop(
    tmp_path: Path, seed: int
) -> None:
    """Also: no fsync ran on the event loop while the disk was stuck (a follower's truncation
    and epoch checkpoints run in worker threads: a stuck disk freezes no node's loop)."""
    history, loop_syncs = await run_stuck_disk(tmp_path, seed, leader_only=True)
    assert_passes(history, seed)
    assert loop_syncs == [], f"seed {seed}: fsyncs on the event loop: {sorted(set(loop_syncs))}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
async def test_stuck_disks_many_seeds(tmp_path: Path, seed: int) -> None:
    history, _loop_syncs = await run_stuck_disk(tmp_path, seed, leader_only=False)
    assert_passes(history, seed)
