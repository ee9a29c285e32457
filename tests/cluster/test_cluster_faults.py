"""Faults on an in-process three-node cluster, checked over the history (``cluster_history``):
producers publish through every node (forwarded to the leader when it is elsewhere) while a
seeded schedule kills and restarts nodes (leaders, the controller, followers alike) and cuts a
node off from the others (its etcd stays: a leader cut from its followers); once healed, every
replica's log and every client's outcome must pass the checker: no confirmed message lost or
reordered, no duplicate of a confirmed one, replicas identical below the high watermark.

One seed runs by default (``TQBROKER_CLUSTER_SEED=N`` replays one); ``-m slow`` runs ten.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from tests.support.cluster_history import CONFIRMED, History, check
from tests.support.cluster_sim import cluster, declare_stream, settled
from tests.support.cluster_workload import in_sync, produce, seeds, take_replicas

NODES = ("n0", "n1", "n2")
STEPS = 8
PRODUCERS = 3


async def run_faults(tmp_path: Path, seed: int) -> History:
    rng = random.Random(seed)
    history = History()
    async with cluster(tmp_path) as made:
        await declare_stream(made)
        await settled(made, lambda: (leader := made.leader()) is not None and len(leader.isr) == 3)
        async with trio.open_nursery() as producers:
            for n in range(PRODUCERS):
                producers.start_soon(produce, made, history, f"p{n}", random.Random(rng.random()))
            dead: list[str] = []
            for _step in range(STEPS):
                await trio.sleep(rng.uniform(0.5, 2.0))
                action = rng.choice(["kill", "cut", "heal", "restart"])
                print(f"step {_step}: {action} (live {sorted(made.members)}, cut {made.cut})")
                if action == "kill" and len(made.members) == len(NODES):
                    victim = rng.choice(sorted(made.members))
                    made.kill(victim)
                    dead.append(victim)
                elif action == "cut" and not made.cut:
                    made.cut.add(rng.choice(sorted(made.members)))
                elif action == "heal":
                    made.cut.clear()
                elif action == "restart" and dead:
                    await made.start(dead.pop())
            made.cut.clear()
            for name in dead:
                await made.start(name)
            await trio.sleep(2)
            producers.cancel_scope.cancel()
        # Healed: every replica back in sync at one high watermark.
        await settled(made, lambda: in_sync(made))
        take_replicas(made, history)
    return history


@pytest.mark.parametrize("seed", seeds(20261203))
async def test_faults_lose_no_confirmed_message(tmp_path: Path, seed: int) -> None:
    history = await run_faults(tmp_path, seed)
    confirmed = [p for p in history.publishes if p.outcome == CONFIRMED]
    assert confirmed, "nothing was confirmed: the run proves nothing"
    assert check(history) == [], f"seed {seed}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
async def test_faults_lose_no_confirmed_message_many_seeds(tmp_path: Path, seed: int) -> None:
    history = await run_faults(tmp_path / str(seed), seed)
    assert check(history) == [], f"seed {seed} (TQBROKER_CLUSTER_SEED={seed} replays it)"
