"""A follower's segment damaged below its high watermark while its node was down (bit rot, a
bad sector, a file restored from an old backup), on the in-process three-node cluster
(``cluster.md`` §C invariant 12: a replica damaged below its high watermark never leads and
never truncates others).

The node was stopped cleanly, so recovery trusts its segments and the damage shows only in a
frame's CRC. Restarted, the damaged replica must not lead, even when the other two nodes die
and it is the only one left that could; it must not make the others cut their logs when they
come back; and it stays out of the ISR (it reports itself damaged). The others' logs then hold
every confirmed message (the history checker over the ISR members).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from tests.support.cluster_history import CONFIRMED, History, Publish, check, payload_of
from tests.support.cluster_sim import Cluster, append, cluster, declare_stream, settled
from tests.support.cluster_workload import PARTITION, in_sync, seeds, take_replicas
from tqbroker.cluster.follower import FollowerReplica
from tqbroker.cluster.records import PartitionRecord

BATCHES = 20
BATCH = 10


def damage(path: Path, rng: random.Random) -> int:
    """Flip four bytes in the middle third of the file (inside frames, below the end)."""
    data = bytearray(path.read_bytes())
    at = rng.randrange(len(data) // 3, 2 * len(data) // 3)
    for i in range(at, at + 4):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return at


def settled_as_follower(made: Cluster, name: str) -> bool:
    """The restarted replica follows again and either knows it is damaged (its follower
    stopped) and every node's view has its report saying so, or it has fetched from its
    leader and is back in its ISR (trusted again)."""
    held = made.members[name].node.roles.held.get(("/", "s"))
    if held is None or not isinstance(held.role, FollowerReplica):
        return False
    if held.role.damaged is None:
        leader = made.leader()
        return held.role.fetches > 0 and leader is not None and name in leader.isr
    reports = [m.node.view.reports_for("/", "s").get(name) for m in made.members.values()]
    return all(report is not None and not report.intact for report in reports)


def survivors_in_sync(made: Cluster, survivors: list[str]) -> bool:
    """A leader whose ISR is exactly ``survivors``, all of them at its high watermark."""
    leader = made.leader()
    return (
        leader is not None
        and sorted(leader.isr) == survivors
        and all(
            made.members[n].partition().high_watermark == leader.high_watermark for n in survivors
        )
    )


async def run_damaged_follower(tmp_path: Path, seed: int) -> tuple[History, str, list[int]]:
    rng = random.Random(seed)
    history = History()
    async with cluster(tmp_path) as made:
        await declare_stream(made)
        await settled(made, lambda: in_sync(made))
        leader = made.leader()
        assert leader is not None
        for batch in range(BATCHES):
            publishes = [Publish("p", batch * BATCH + n, PARTITION) for n in range(BATCH)]
            history.publishes.extend(publishes)
            assert await append(leader, [p.payload for p in publishes])
            for publish in publishes:
                publish.outcome = CONFIRMED
        await settled(made, lambda: in_sync(made))
        others = sorted(n for n in made.members if n != leader.node_id)
        victim = rng.choice(others)
        survivors = sorted(n for n in made.members if n != victim)
        held = {n: made.members[n].partition().high_watermark for n in survivors}
        made.kill(victim)
        await made.wait_stopped(victim)
        segment = made.segment_files(victim)[0]
        at = damage(segment, rng)
        print(f"seed {seed}: {victim} (a follower of {leader.node_id}) damaged at byte {at}")
        records: list[PartitionRecord] = []
        async with trio.open_nursery() as watchers:
            await watchers.start(made.watch_records, records)
            await made.start(victim)
            await settled(made, lambda: settled_as_follower(made, victim))
            # The others die: the damaged replica is the only one left that could lead.
            for name in survivors:
                made.kill(name)
            await trio.sleep(made.members[victim].node.settings.lease_ttl + 2)
            led = sorted({r.epoch for r in records if r.leader == victim})
            assert led == [], f"seed {seed}: the damaged replica {victim} led in epochs {led}"
            for name in survivors:
                await made.start(name)
            await settled(made, lambda: survivors_in_sync(made, survivors))
            watchers.cancel_scope.cancel()
        # Nothing the survivors held was cut back.
        for name in survivors:
            assert made.members[name].partition().high_watermark >= held[name], name
        take_replicas(made, history, survivors)
    print(f"partition records since: {[(r.epoch, r.leader, sorted(r.isr)) for r in records]}")
    return history, victim, sorted({r.epoch for r in records if r.leader == victim})


@pytest.mark.parametrize("seed", seeds(20261205))
async def test_a_follower_damaged_below_its_high_watermark_never_leads(
    tmp_path: Path, seed: int
) -> None:
    history, victim, led = await run_damaged_follower(tmp_path, seed)
    assert led == [], f"seed {seed}: the damaged replica {victim} led in epochs {led}"
    assert check(history) == [], f"seed {seed}"
    assert all(len(r.records) == BATCHES * BATCH for r in history.replicas)
    assert {payload_of("p", n) for n in range(BATCHES * BATCH)} <= set(
        history.replicas[0].records.values()
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
async def test_damaged_followers_many_seeds(tmp_path: Path, seed: int) -> None:
    history, victim, led = await run_damaged_follower(tmp_path, seed)
    assert led == [], f"seed {seed}: the damaged replica {victim} led in epochs {led}"
    assert check(history) == [], f"seed {seed}"
