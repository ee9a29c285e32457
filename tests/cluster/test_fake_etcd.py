"""What only ``FakeEtcd`` has (the conformance suite covers what it shares with etcd): views
cut off one at a time, stop and restart on a mock clock, leases expiring on the dot, and lease
ids fixed by the seed."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tqbroker.cluster.metadata import MetadataUnavailable
from tqbroker.testing.fake_etcd import FakeEtcd


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_cut_view_fails_alone_until_healed(clock: trio.testing.MockClock) -> None:
    etcd = FakeEtcd()
    cut, other = etcd.client(), etcd.client()
    async with cut.watch("k") as cut_events, other.watch("k") as other_events:
        cut.cut = True
        with pytest.raises(MetadataUnavailable):
            await anext(cut_events)
        with pytest.raises(MetadataUnavailable):
            await cut.get("k")
        revision = await other.put("k", b"v")
        assert [event.kv.mod_revision for event in await anext(other_events)] == [revision]
    cut.cut = False
    assert [kv.value for kv in (await cut.get("k")).kvs] == [b"v"]


async def test_stopped_leases_wait_for_the_restart(clock: trio.testing.MockClock) -> None:
    etcd = FakeEtcd()
    store = etcd.client()
    async with trio.open_nursery() as nursery:
        await nursery.start(etcd.run)
        lease = await store.grant_lease(10)
        await store.put("k", b"v", lease=lease.id)
        await trio.sleep(9)
        etcd.stop()
        with pytest.raises(MetadataUnavailable):
            await etcd.get("k")
        await trio.sleep(3600)  # no lease expires while etcd is down
        etcd.restart()
        await trio.sleep(9.9)
        assert (await etcd.get("k")).kvs  # a full TTL again from the restart
        async with store.watch("k") as events:
            [deleted] = await anext(events)  # at 10 s, with no call to notice it
        assert deleted.kind == "delete"
        assert trio.current_time() == pytest.approx(9 + 3600 + 10)
        nursery.cancel_scope.cancel()


async def test_lease_ids_follow_the_seed() -> None:
    first, second, other = FakeEtcd(seed=7), FakeEtcd(seed=7), FakeEtcd(seed=8)
    ids = [(await first.client().grant_lease(5)).id for _ in range(3)]
    assert ids == [(await second.client().grant_lease(5)).id for _ in range(3)]
    assert ids != [(await other.client().grant_lease(5)).id for _ in range(3)]
    assert len(set(ids)) == 3
    assert all(0 < lease_id < 2**63 for lease_id in ids)
