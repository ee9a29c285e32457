"""Whole-cluster power cuts on the in-process three-node cluster (``cluster_sim`` with
``disks``), checked over the history (``cluster_history``; ``cluster.md`` §C invariant 11).

Producers publish through every node and a consumer reads from every node while, at a seeded
moment, the power goes on all three nodes at once: each node's data directory becomes what
its disk had fsync'd (``SimDisk``: the power-cut recorder's ``synced`` crash state: every byte
and every directory entry not made durable is gone), and all three restart on it. After a
few rounds, once the replicas are in sync again, every confirmed message must be on every
ISR member's log at one offset, every delivered record must be there as read (no phantom
read), and the replicas must agree byte for byte below the high watermark.

One seed runs by default (``TQBROKER_CLUSTER_SEED=N`` replays one); ``-m slow`` runs more
seeds, and the ``torn`` and ``prefix`` crash states too (what survives beyond the fsyncs).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from tests.support.cluster_history import CONFIRMED, History, check
from tests.support.cluster_sim import cluster, declare_stream, settled
from tests.support.cluster_workload import consume, in_sync, produce, seeds, take_replicas

ROUNDS = 2
PRODUCERS = 3


async def run_power_cuts(
    tmp_path: Path, seed: int, *, rounds: int = ROUNDS, variant: str = "synced"
) -> History:
    rng = random.Random(seed)
    history = History()
    async with cluster(tmp_path, disks=True) as made:
        await declare_stream(made)
        await settled(made, lambda: in_sync(made))
        for round_ in range(rounds):
            async with trio.open_nursery() as clients:
                for n in range(PRODUCERS):
                    producer = random.Random(rng.random())
                    clients.start_soon(produce, made, history, f"p{round_}.{n}", producer)
                consumer = random.Random(rng.random())
                clients.start_soon(consume, made, history, f"c{round_}", consumer)
                await trio.sleep(rng.uniform(0.5, 2.0))
                confirmed = sum(p.outcome == CONFIRMED for p in history.publishes)
                print(f"round {round_}: power cut after {confirmed} confirms ({variant})")
                # No checkpoint between the cut and the clients' end: an outcome the clients
                # saw was decided before the power went.
                clients.cancel_scope.cancel()
                running = made.power_cut_now()
            await made.restore_power(running, variant)
            await settled(made, lambda: in_sync(made))
        take_replicas(made, history)
    return history


def assert_passes(history: History, seed: int) -> None:
    confirmed = [p for p in history.publishes if p.outcome == CONFIRMED]
    assert confirmed, "nothing was confirmed: the run proves nothing"
    assert history.deliveries, "nothing was read: the run proves nothing about reads"
    violations = check(history)
    replicas = [(r.node, r.high_watermark, len(r.records)) for r in history.replicas]
    assert violations == [], (
        f"seed {seed} (TQBROKER_CLUSTER_SEED={seed} replays it): {len(violations)} violations, "
        f"{len(confirmed)} confirms, replicas (node, high watermark, records) {replicas}: "
        + "; ".join(violations[:5])
    )


@pytest.mark.parametrize("seed", seeds(20261204))
async def test_a_power_cut_to_every_node_loses_no_confirmed_message(
    tmp_path: Path, seed: int
) -> None:
    assert_passes(await run_power_cuts(tmp_path, seed), seed)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["synced", "torn", "prefix"])
@pytest.mark.parametrize("seed", range(4))
async def test_power_cuts_many_seeds(tmp_path: Path, seed: int, variant: str) -> None:
    assert_passes(await run_power_cuts(tmp_path, seed, rounds=3, variant=variant), seed)


async def test_a_power_cut_before_any_publish_keeps_every_replica(tmp_path: Path) -> None:
    """A new stream's replica ids are in its ISR before anything is confirmed in it: a power
    cut then must not lose them (every replica would come back a stranger to the ISR, and
    the partition stay offline for good)."""
    async with cluster(tmp_path, disks=True) as made:
        await declare_stream(made)
        await settled(made, lambda: in_sync(made))
        replicas = {name: m.partition().replica_id for name, m in made.members.items()}
        await made.restore_power(made.power_cut_now())
        assert {name: m.partition().replica_id for name, m in made.members.items()} == replicas
        await settled(made, lambda: in_sync(made))
