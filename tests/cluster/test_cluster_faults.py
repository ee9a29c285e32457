"""Faults on an in-process three-node cluster, checked over the history (``cluster_history``):
producers publish through every node (forwarded to the leader when it is elsewhere) while a
seeded schedule kills and restarts nodes (leaders, the controller, followers alike) and cuts a
node off from the others (its etcd stays: a leader cut from its followers); once healed, every
replica's log and every client's outcome must pass the checker: no confirmed message lost or
reordered, no duplicate of a confirmed one, replicas identical below the high watermark.

One seed runs by default (``TQBROKER_CLUSTER_SEED=N`` replays one); ``-m slow`` runs ten.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import trio

from tests.support.cluster_history import (
    CONFIRMED,
    NACKED,
    History,
    Publish,
    Replica,
    check,
    payload_of,
)
from tests.support.cluster_sim import Cluster, cluster, declare_stream, settled
from tqbroker.model import Message

NODES = ("n0", "n1", "n2")
STEPS = 8
PRODUCERS = 3
PARTITION = "%2F/s"


async def produce(made: Cluster, history: History, name: str, rng: random.Random) -> None:
    """Publish one message at a time through a random live node until cancelled, recording
    each outcome; a nacked one is sent again under the same sequence number."""
    seq, last_seq = 0, -1
    while True:
        live = sorted(made.members)
        if not live:
            await trio.sleep(0.05)
            continue
        member = made.members[rng.choice(live)]
        # A nack says "not confirmed", not "not written" (a forward cut off after the leader
        # took it): a publish sent again may be duplicated, as docs/cluster.md says.
        publish = Publish(name, seq, PARTITION, resent=seq == last_seq)
        last_seq = seq
        history.publishes.append(publish)
        try:
            _first, taken, error = member.partition().append(
                [Message("", "s", b"", payload_of(name, seq))]
            )
        except (KeyError, AssertionError):  # the stream is not open there (a node restarting)
            taken, error = [], None
        if error is not None or not taken:
            publish.outcome = NACKED
            await trio.sleep(0.05)
            continue
        durability = taken[0]
        if durability is None:
            publish.outcome = CONFIRMED
        else:
            commit, ticket = durability
            with trio.move_on_after(15):
                publish.outcome = CONFIRMED if await commit.wait(ticket) else NACKED
        if publish.outcome == CONFIRMED:
            seq += 1
        else:
            await trio.sleep(0.05)


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
        await settled(
            made,
            lambda: (
                (leader := made.leader()) is not None
                and len(leader.isr) == 3
                and len({m.partition().high_watermark for m in made.members.values()}) == 1
            ),
        )
        for name, member in made.members.items():
            partition = member.partition()
            high_watermark = partition.high_watermark
            records = partition.read_many(0, high_watermark + 1)
            frames, _end = partition.replica_frames(0, high_watermark, 1 << 30)
            history.replicas.append(
                Replica(
                    node=name,
                    partition=PARTITION,
                    records={r.offset: r.message.body for r in records},
                    frames=[head + rest for head, rest in frames],
                    high_watermark=high_watermark,
                )
            )
    return history


def seeds() -> list[int]:
    if "TQBROKER_CLUSTER_SEED" in os.environ:
        return [int(os.environ["TQBROKER_CLUSTER_SEED"])]
    return [20261203]


@pytest.mark.parametrize("seed", seeds())
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
