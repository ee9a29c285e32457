"""``FakeEtcd``: etcd's key-value, lease and watch semantics in memory, on Trio's clock.

The in-memory twin of ``tqbroker.cluster.etcd.EtcdClient`` for the cluster simulation (a
``trio.testing.MockClock`` with autojump runs a cluster's minutes in milliseconds). It passes
the same conformance suite as real etcd (``tests/cluster/test_metadata_conformance.py``) and
keeps what etcd 3.4/3.5 were seen to do (``shared/reference/cluster.md`` A3):

- one global revision (starting at 1) that each write increments once (a txn's writes share
  it; a delete that deletes nothing and a compaction do not count); keys have a create and a
  mod revision and a version; a delete event carries the key and its mod revision only;
- history back to the compact revision: ``get(revision=)`` and ``watch(start_revision=)``
  before it raise ``Compacted``; a revision past the current one is ``InvalidRequest``;
  compacting at or before the compact revision does nothing;
- txns refuse more than ``MAX_TXN_OPS`` operations in a branch, a key put twice (or put and
  deleted) in a branch, an empty key; a value compare on a missing key never holds (etcd
  cannot tell a missing value from an empty one, so it fails every value compare on one);
- leases of at least 2 s (etcd's minimum with its default election timeout) expire at their
  TTL, deleting their keys in one revision (``run``, started with ``nursery.start``, does it
  in the background; every call also expires what is due first); a keepalive of a lease gone
  is ``LeaseLost``, a revoke of one no error;
- ``stop()`` makes every call raise ``MetadataUnavailable`` and breaks every watch with it;
  leases do not expire meanwhile, and ``restart()`` gives each its full TTL again, as etcd
  does (the remaining TTL is not persisted);
- ``client()`` is a ``MetadataStore`` view of one node; ``view.cut = True`` cuts that node
  off (its calls raise ``MetadataUnavailable``, its watches break) until set back to False.
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from itertools import groupby
from typing import Final, TypeVar

import attrs
import trio

from ..cluster.metadata import (
    MAX_TXN_OPS,
    Compacted,
    Compare,
    Delete,
    Get,
    InvalidRequest,
    KeyValue,
    Lease,
    LeaseLost,
    MetadataError,
    MetadataUnavailable,
    Operation,
    Put,
    RangeResult,
    TxnResult,
    WatchEvent,
)

MIN_LEASE_TTL: Final = 2

WatchItem = Sequence[WatchEvent] | MetadataError
_T = TypeVar("_T")


@attrs.define
class _LeaseState:
    ttl: int
    deadline: float
    keys: set[str] = attrs.Factory(set)


@attrs.define(eq=False)
class _Watcher:
    key: str
    prefix: bool
    min_revision: int
    send: trio.MemorySendChannel[WatchItem]

    def covers(self, key: str) -> bool:
        return key.startswith(self.key) if self.prefix else key == self.key


def _in_range(key: str, wanted: str, prefix: bool) -> bool:
    return key.startswith(wanted) if prefix else key == wanted


def _compare_holds(compare: Compare, kv: KeyValue | None) -> bool:
    if compare.target == "value":
        if not isinstance(compare.value, bytes):
            raise InvalidRequest(f"a value compare needs bytes, not {compare.value!r}")
        if kv is None:
            return False
        actual: int | bytes = kv.value
    else:
        if not isinstance(compare.value, int):
            raise InvalidRequest(f"a {compare.target} compare needs an int: {compare.value!r}")
        actual = _int_target(compare, kv)
    wanted = compare.value
    match compare.result:
        case "=":
            return actual == wanted
        case "!=":
            return actual != wanted
        case "<":
            return actual < wanted  # type: ignore[operator]
        case ">":
            return actual > wanted  # type: ignore[operator]


def _int_target(compare: Compare, kv: KeyValue | None) -> int:
    if kv is None:
        return 0
    match compare.target:
        case "version":
            return kv.version
        case "create":
            return kv.create_revision
        case "mod":
            return kv.mod_revision
        case _:
            return kv.lease


def _check_branch(ops: Sequence[Operation]) -> None:
    """etcd's request checks: the op count, no empty key, no key put twice or put and
    deleted in one branch."""
    if len(ops) > MAX_TXN_OPS:
        raise InvalidRequest("etcdserver: too many operations in txn request")
    puts: set[str] = set()
    for op in ops:
        if not op.key and not (isinstance(op, Get | Delete) and op.prefix):
            raise InvalidRequest("etcdserver: key is not provided")
        if isinstance(op, Put):
            if op.key in puts:
                raise InvalidRequest("etcdserver: duplicate key given in txn request")
            puts.add(op.key)
    for op in ops:
        if isinstance(op, Delete) and any(_in_range(key, op.key, op.prefix) for key in puts):
            raise InvalidRequest("etcdserver: duplicate key given in txn request")


class FakeEtcd:
    """One in-memory etcd (see the module doc); ``seed`` fixes the lease ids it hands out."""

    def __init__(self, *, seed: int = 0) -> None:
        self._revision = 1
        self._compact_revision = 0
        self._kvs: dict[str, KeyValue] = {}
        # History: the state before the oldest change kept, and the changes since (each with
        # its revision, every revision at or after the compact revision).
        self._base: dict[str, KeyValue] = {}
        self._log: list[tuple[int, WatchEvent]] = []
        self._leases: dict[int, _LeaseState] = {}
        self._watchers: set[_Watcher] = set()
        self._random = random.Random(seed)
        self._stopped = False
        self._wakeup = trio.Event()
        self._own = self.client()

    def client(self) -> FakeEtcdClient:
        """A new ``MetadataStore`` view of this store (one per simulated node)."""
        return FakeEtcdClient(self)

    @property
    def revision(self) -> int:
        return self._revision

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Expire leases at their deadlines, for ever (``await nursery.start(etcd.run)``)."""
        task_status.started()
        while True:
            self._expire_due()
            wakeup = self._wakeup = trio.Event()
            deadlines = [lease.deadline for lease in self._leases.values()]
            with trio.move_on_at(min(deadlines) if deadlines and not self._stopped else math.inf):
                await wakeup.wait()

    def stop(self) -> None:
        """etcd goes down: every call fails, every watch breaks, no lease expires."""
        self._stopped = True
        for watcher in list(self._watchers):
            self._break(watcher, MetadataUnavailable("etcd stopped"))

    def restart(self) -> None:
        """etcd is back, every lease at its full TTL again."""
        self._stopped = False
        now = trio.current_time()
        for lease in self._leases.values():
            lease.deadline = now + lease.ttl
        self._wakeup.set()

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return await self._own.put(key, value, lease=lease)

    async def get(self, key: str, *, prefix: bool = False, revision: int = 0) -> RangeResult:
        return await self._own.get(key, prefix=prefix, revision=revision)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        return await self._own.delete(key, prefix=prefix)

    # The operations, each done at once (the client checks availability and checkpoints).

    def _range(self, key: str, prefix: bool, revision: int) -> RangeResult:
        _check_branch([Get(key, prefix)])
        if revision > self._revision:
            raise InvalidRequest("etcdserver: mvcc: required revision is a future revision")
        if revision and revision < self._compact_revision:
            raise Compacted(self._compact_revision)
        state = self._kvs if not revision else self._state_at(revision)
        kvs = sorted(
            (kv for name, kv in state.items() if _in_range(name, key, prefix)),
            key=lambda kv: kv.key,
        )
        return RangeResult(kvs, self._revision)

    def _txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation],
    ) -> TxnResult:
        if len(compares) > MAX_TXN_OPS:
            raise InvalidRequest("etcdserver: too many operations in txn request")
        _check_branch(success)
        _check_branch(failure)
        succeeded = all(_compare_holds(c, self._kvs.get(c.key)) for c in compares)
        ops = success if succeeded else failure
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise LeaseLost("etcdserver: requested lease not found")
        revision = self._revision + 1
        events: list[WatchEvent] = []
        responses: list[RangeResult | int | None] = []
        for op in ops:
            if isinstance(op, Put):
                events.append(self._write_put(op, revision))
                responses.append(None)
            elif isinstance(op, Delete):
                deleted = self._write_deletes(self._matching(op.key, op.prefix), revision)
                events += deleted
                responses.append(len(deleted))
            else:
                result = self._range(op.key, op.prefix, 0)
                responses.append(RangeResult(result.kvs, revision - 1 + bool(events)))
        self._commit(events)
        return TxnResult(succeeded, self._revision, responses)

    def _grant(self, ttl: int) -> Lease:
        ttl = max(ttl, MIN_LEASE_TTL)
        lease_id = 0
        while lease_id == 0 or lease_id in self._leases:
            lease_id = self._random.getrandbits(62)
        self._leases[lease_id] = _LeaseState(ttl, trio.current_time() + ttl)
        self._wakeup.set()
        return Lease(lease_id, ttl)

    def _keepalive(self, lease_id: int) -> int:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseLost(f"lease {lease_id:x} is gone")
        lease.deadline = trio.current_time() + lease.ttl
        return lease.ttl

    def _revoke(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            self._commit(self._write_deletes(sorted(lease.keys), self._revision + 1))

    def _compact(self, revision: int) -> None:
        if revision > self._revision:
            raise InvalidRequest("etcdserver: mvcc: required revision is a future revision")
        if revision <= self._compact_revision:
            return
        kept = [(rev, event) for rev, event in self._log if rev >= revision]
        self._apply(self._base, (event for rev, event in self._log if rev < revision))
        self._log = kept
        self._compact_revision = revision

    def _watch(self, watcher: _Watcher) -> None:
        if watcher.min_revision < self._compact_revision:
            watcher.send.send_nowait(Compacted(self._compact_revision))
            return
        wanted = (
            (rev, event)
            for rev, event in self._log
            if rev >= watcher.min_revision and watcher.covers(event.kv.key)
        )
        for _rev, changes in groupby(wanted, key=lambda change: change[0]):
            watcher.send.send_nowait([event for _, event in changes])
        self._watchers.add(watcher)

    # Writes and history.

    def _matching(self, key: str, prefix: bool) -> list[str]:
        return sorted(name for name in self._kvs if _in_range(name, key, prefix))

    def _write_put(self, put: Put, revision: int) -> WatchEvent:
        old = self._kvs.get(put.key)
        if old is not None and old.lease in self._leases:
            self._leases[old.lease].keys.discard(put.key)
        if put.lease:
            self._leases[put.lease].keys.add(put.key)
        kv = KeyValue(
            put.key,
            put.value,
            create_revision=old.create_revision if old else revision,
            mod_revision=revision,
            version=old.version + 1 if old else 1,
            lease=put.lease,
        )
        self._kvs[put.key] = kv
        return WatchEvent("put", kv)

    def _write_deletes(self, keys: Iterable[str], revision: int) -> list[WatchEvent]:
        events = []
        for key in keys:
            old = self._kvs.pop(key)
            if old.lease in self._leases:
                self._leases[old.lease].keys.discard(key)
            events.append(WatchEvent("delete", KeyValue(key, b"", 0, revision, 0)))
        return events

    def _commit(self, events: list[WatchEvent]) -> None:
        """The writes of one revision are done: history and watches get them."""
        if not events:
            return
        self._revision += 1
        self._log += [(self._revision, event) for event in events]
        for watcher in list(self._watchers):
            if self._revision >= watcher.min_revision:
                mine = [event for event in events if watcher.covers(event.kv.key)]
                if mine:
                    watcher.send.send_nowait(mine)

    def _state_at(self, revision: int) -> dict[str, KeyValue]:
        state = dict(self._base)
        self._apply(state, (event for rev, event in self._log if rev <= revision))
        return state

    @staticmethod
    def _apply(state: dict[str, KeyValue], events: Iterable[WatchEvent]) -> None:
        for event in events:
            if event.kind == "put":
                state[event.kv.key] = event.kv
            else:
                state.pop(event.kv.key, None)

    def _expire_due(self) -> None:
        if self._stopped:
            return
        now = trio.current_time()
        due = sorted(
            (lease.deadline, lease_id)
            for lease_id, lease in self._leases.items()
            if lease.deadline <= now
        )
        for _deadline, lease_id in due:
            self._revoke(lease_id)

    def _break(self, watcher: _Watcher, error: MetadataError) -> None:
        if watcher in self._watchers:
            self._watchers.discard(watcher)
            watcher.send.send_nowait(error)


class FakeEtcdClient:
    """One node's ``MetadataStore`` view of a ``FakeEtcd``; ``cut = True`` cuts it off."""

    def __init__(self, etcd: FakeEtcd) -> None:
        self._etcd = etcd
        self._cut = False
        self._watchers: set[_Watcher] = set()

    @property
    def cut(self) -> bool:
        return self._cut

    @cut.setter
    def cut(self, cut: bool) -> None:
        self._cut = cut
        if cut:
            for watcher in list(self._watchers):
                self._etcd._break(watcher, MetadataUnavailable("cut off from etcd"))

    async def get(self, key: str, *, prefix: bool = False, revision: int = 0) -> RangeResult:
        return await self._call(lambda: self._etcd._range(key, prefix, revision))

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        result = await self._call(lambda: self._etcd._txn((), [Put(key, value, lease)], ()))
        return result.revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        result = await self._call(lambda: self._etcd._txn((), [Delete(key, prefix)], ()))
        deleted = result.responses[0]
        assert isinstance(deleted, int)
        return deleted

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        return await self._call(lambda: self._etcd._txn(compares, success, failure))

    async def grant_lease(self, ttl: int) -> Lease:
        return await self._call(lambda: self._etcd._grant(ttl))

    async def keepalive(self, lease: int) -> int:
        return await self._call(lambda: self._etcd._keepalive(lease))

    async def revoke(self, lease: int) -> None:
        await self._call(lambda: self._etcd._revoke(lease))

    async def compact(self, revision: int) -> None:
        await self._call(lambda: self._etcd._compact(revision))

    @asynccontextmanager
    async def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[AsyncIterator[Sequence[WatchEvent]]]:
        send, receive = trio.open_memory_channel[WatchItem](math.inf)
        watcher = _Watcher(key, prefix, start_revision or self._etcd.revision + 1, send)
        await self._call(lambda: self._etcd._watch(watcher))
        self._watchers.add(watcher)
        try:
            yield _WatchStream(receive)
        finally:
            self._watchers.discard(watcher)
            self._etcd._watchers.discard(watcher)
            receive.close()

    async def aclose(self) -> None:
        self.cut = True

    async def _call(self, operation: Callable[[], _T]) -> _T:
        await trio.lowlevel.checkpoint()
        if self._etcd._stopped:
            raise MetadataUnavailable("etcd is stopped")
        if self._cut:
            raise MetadataUnavailable("cut off from etcd")
        self._etcd._expire_due()
        return operation()


class _WatchStream:
    """A watch's batches; raises the error that ended it."""

    def __init__(self, receive: trio.MemoryReceiveChannel[WatchItem]) -> None:
        self._receive = receive

    def __aiter__(self) -> _WatchStream:
        return self

    async def __anext__(self) -> Sequence[WatchEvent]:
        item = await self._receive.receive()
        if isinstance(item, MetadataError):
            raise item
        return item


__all__ = ["MIN_LEASE_TTL", "FakeEtcd", "FakeEtcdClient"]
