"""A follower's segment damaged below its high watermark while its node was down (bit rot, a
bad sector, a file restored from an old backup), on the in-process three-node cluster
(``cluster.md`` §C invariant 12: a replica damaged below its high watermark never leads and
never truncates others).

The node was stopped cleanly, so recovery trusts its segments and the damage shows only in a
frame's CRC. The whole cluster is down when it is damaged, and the damaged node comes back
first, alone: it must not lead (it reports itself damaged), though it is the only node that
could. Then the others come back: one of them leads, and the damaged replica throws its log
away and copies it anew under a new replica id (the ISR held the old one): it may count, and
lead, only once back in the ISR under the new id. It must not make the others cut their logs;
afterwards every node's log holds every confirmed message (the history checker over all
three, byte-identical frames).
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


def copied_anew(made: Cluster, name: str, old_id: str) -> bool:
    """The damaged replica follows again, has thrown its log away and is back in its
    leader's ISR under a new replica id."""
    held = made.members[name].node.roles.held.get(("/", "s"))
    if held is None or not isinstance(held.role, FollowerReplica):
        return False
    leader = made.leader()
    replica_id = made.members[name].partition().replica_id
    return (
        held.role.copied_anew == 1
        and replica_id != old_id
        and leader is not None
        and leader.isr.get(name) == replica_id
    )


def reported_damaged(made: Cluster, name: str) -> bool:
    """Every live node's view has the replica's report saying it is not intact."""
    reports = [m.node.view.reports_for("/", "s").get(name) for m in made.members.values()]
    return all(report is not None and not report.intact for report in reports)


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
        old_id = made.members[victim].partition().replica_id
        for name in sorted(made.members):  # the whole cluster goes down
            made.kill(name)
            await made.wait_stopped(name)
        segment = made.segment_files(victim)[0]
        at = damage(segment, rng)
        print(f"seed {seed}: {victim} (a follower of {leader.node_id}) damaged at byte {at}")
        records: list[PartitionRecord] = []
        async with trio.open_nursery() as watchers:
            await watchers.start(made.watch_records, records)
            await made.start(victim)  # alone: the only node that could lead
            await settled(made, lambda: reported_damaged(made, victim))
            await trio.sleep(made.members[victim].node.settings.lease_ttl + 2)
            led = sorted({r.epoch for r in records if r.leader == victim})
            assert led == [], f"seed {seed}: the damaged replica {victim} led in epochs {led}"
            for name in survivors:
                await made.start(name)
            await settled(made, lambda: copied_anew(made, victim, old_id))
            await settled(made, lambda: in_sync(made))
            watchers.cancel_scope.cancel()
        # Nothing the survivors held was cut back.
        for name in survivors:
            assert made.members[name].partition().high_watermark >= held[name], name
        # It led, if ever, only in the ISR under its new id (copied anew, caught up).
        new_id = made.members[victim].partition().replica_id
        unfit = [r.epoch for r in records if r.leader == victim and r.isr.get(victim) != new_id]
        assert unfit == [], f"seed {seed}: {victim} led in epochs {unfit} before it caught up"
        take_replicas(made, history)
    print(f"partition records since: {[(r.epoch, r.leader, sorted(r.isr)) for r in records]}")
    return history, victim, unfit


@pytest.mark.parametrize("seed", seeds(20261205))
async def test_a_damaged_follower_never_leads_and_is_copied_anew(tmp_path: Path, seed: int) -> None:
    history, _victim, _unfit = await run_damaged_follower(tmp_path, seed)
    assert check(history) == [], f"seed {seed}"
    assert len(history.replicas) == 3
    assert all(len(r.records) == BATCHES * BATCH for r in history.replicas)
    assert {payload_of("p", n) for n in range(BATCHES * BATCH)} <= set(
        history.replicas[0].records.values()
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
async def test_damaged_followers_many_seeds(tmp_path: Path, seed: int) -> None:
    history, _victim, _unfit = await run_damaged_follower(tmp_path, seed)
    assert check(history) == [], f"seed {seed}"
