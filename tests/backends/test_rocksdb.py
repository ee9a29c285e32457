"""The RocksDB backend (``backends/rocksdb``, distribution ``tqbroker-rocksdb``) on a real RocksDB:
the conformance suite, then what the suite cannot see: the entry point, the key layout and record
encoding, delivery reservations, flushes running in another thread while the Trio thread goes on,
a process killed with SIGKILL, and a write failure (a real one: a file-size limit) followed by
recovery. Skipped when ``tqbroker-rocksdb`` is not installed."""

from __future__ import annotations

import gc
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from rocksdict import Options, Rdict
from tqbroker_rocksdb import RocksDBBackend, RocksDBQueueStore
from tqbroker_rocksdb.codec import (
    body_size,
    decode_record,
    encode_record,
    message_key,
    parse_registry_key,
    queue_end,
    queue_prefix,
    registry_key,
    reservation_key,
    transient_end,
    transient_key,
    transient_prefix,
)

from tests.support.storage import flush
from tqbroker.backends import FLUSH_FIRST, Backend, Message, Popped
from tqbroker.plugins.loader import load_backends
from tqbroker.protocol.methods import BasicProperties
from tqbroker.testing.conformance import BackendConformance


class TestRocksDBConformance(BackendConformance):
    def make_backend(self, data_dir: Path) -> RocksDBBackend:
        return RocksDBBackend()


class TestRocksDBTinyReservationConformance(BackendConformance):
    """A reservation of one or two messages: pops keep running out of it, which exercises the
    hold-back-until-flush path on every case and in the state machine."""

    def make_backend(self, data_dir: Path) -> RocksDBBackend:
        return RocksDBBackend(reservation_min=1, reservation_max=2)


# --- helpers -----------------------------------------------------------------------------------


def message(n: int, body: bytes | None = None) -> Message:
    properties = BasicProperties(delivery_mode=2, message_id=f"m{n}").encode()
    return Message(
        "amq.direct", f"key.{n}", properties, body if body is not None else b"body %d" % n
    )


def same(a: Message, b: Message) -> bool:
    return (a.exchange, a.routing_key, bytes(a.properties_raw), bytes(a.body)) == (
        b.exchange,
        b.routing_key,
        bytes(b.properties_raw),
        bytes(b.body),
    )


def pop(backend: RocksDBBackend, store: RocksDBQueueStore) -> Popped | None:
    """Pop as the broker does: flush and retry when the store holds a message back."""
    popped = store.pop()
    if popped is FLUSH_FIRST:
        assert backend.needs_flush
        assert flush(backend)
        popped = store.pop()
        assert popped is not FLUSH_FIRST
        assert popped is not None
    if store.wants_flush:
        flush(backend)
    return popped


def drain(backend: RocksDBBackend, store: RocksDBQueueStore) -> list[Popped]:
    out: list[Popped] = []
    while (item := pop(backend, store)) is not None:
        out.append(item)
    return out


def opened(
    data_dir: Path, *, reservation_min: int = 64, reservation_max: int = 8192
) -> RocksDBBackend:
    backend = RocksDBBackend(reservation_min=reservation_min, reservation_max=reservation_max)
    backend.open(data_dir)
    return backend


def raw_keys(data_dir: Path) -> list[bytes]:
    """Every key of the database, read with rocksdict directly (the backend must be closed)."""
    db = Rdict(str(data_dir / "rocksdb"), Options(raw_mode=True))
    try:
        keys = db.keys()
        return [key for key in keys if isinstance(key, bytes)]
    finally:
        db.close()


def transient_keys(keys: list[bytes]) -> list[bytes]:
    return [key for key in keys if key.startswith(b"t")]


def live_keys(backend: RocksDBBackend, begin: bytes, end: bytes) -> list[bytes]:
    """The keys in ``[begin, end)`` of an open backend's database."""
    db = backend.writer._db
    assert db is not None
    out: list[bytes] = []
    for key in db.keys(from_key=begin):
        assert isinstance(key, bytes)
        if key >= end:
            break
        out.append(key)
    return out


def run_child(script: str, data_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        [sys.executable, str(path), str(data_dir), str(tmp_path / "state.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- packaging, keys, records --------------------------------------------------------------------


def test_registered_under_the_backends_entry_point() -> None:
    (ep,) = [ep for ep in entry_points(group="tqbroker.backends") if ep.name == "rocksdb"]
    assert ep.value == "tqbroker_rocksdb:RocksDBBackend"
    assert ep.dist is not None
    assert ep.dist.name == "tqbroker-rocksdb"
    backend = load_backends()["rocksdb"]
    assert isinstance(backend, RocksDBBackend)
    assert isinstance(backend, Backend)
    assert backend.durable


@pytest.mark.parametrize(
    "msg",
    [
        Message("", "", b"", b""),
        Message("é" * 127, "r" * 255, b"\x00\x00", bytes(range(256)) * 4, timestamp_ms=1),
        Message(
            "обмен",
            "ключ.🐇.#",
            BasicProperties(headers={"k": [1, None]}).encode(),
            b"x",
            timestamp_ms=1_700_000_000_123,
        ),
        Message(
            "ex", "rk", b"\x80\x00" + b"p" * 70000, os.urandom(1 << 20), timestamp_ms=2**64 - 1
        ),
    ],
    ids=["empty", "long-names", "unicode", "big"],
)
def test_record_round_trip(msg: Message) -> None:
    record = encode_record(msg)
    assert len(record) == 17 + len(msg.exchange.encode()) + len(msg.routing_key.encode()) + len(
        msg.properties_raw
    ) + len(msg.body)
    decoded = decode_record(record)
    assert same(decoded, msg)
    assert decoded.timestamp_ms == msg.timestamp_ms
    assert body_size(record) == len(msg.body)


def test_old_record_version_is_refused() -> None:
    record = b"\x01" + encode_record(Message("ex", "rk", b"", b"body"))[1:]
    with pytest.raises(ValueError, match="version 1"):
        decode_record(record)


def test_key_layout_orders_ids_numerically() -> None:
    prefix = queue_prefix(7)
    ids = [1, 2, 255, 256, 65535, 65536, 2**32, 2**40 + 3, 2**63]
    keys = [message_key(prefix, i) for i in ids]
    assert sorted(keys) == keys
    assert all(prefix <= key < queue_end(7) for key in keys)
    assert queue_end(7) == queue_prefix(8)
    assert parse_registry_key(registry_key("v\u00e9", "q/\x00.")) == ("v\u00e9", "q/\x00.")
    assert registry_key("ab", "c") != registry_key("a", "bc")


# --- QueueStore semantics ------------------------------------------------------------------------


def test_push_pop_ack_requeue(tmp_path: Path) -> None:
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    assert backend.open_queue("/", "q") is store
    ids = [store.push(message(n), persistent=n != 2) for n in range(5)]
    assert ids == [1, 2, 3, 4, 5]
    first = pop(backend, store)
    second = pop(backend, store)
    third = pop(backend, store)
    assert [p[0] for p in (first, second, third) if p] == [1, 2, 3]
    assert third is not None
    assert same(third[1], message(2))
    assert not third[2]
    assert (store.ready_count, store.unacked_count) == (2, 3)
    store.requeue(2)
    store.ack(1)
    store.ack(1)  # unknown now: ignored
    store.requeue(99)  # never issued: ignored
    assert (store.ready_count, store.unacked_count) == (3, 1)
    again = pop(backend, store)
    assert again is not None
    assert again[0] == 2
    assert again[2]
    assert same(again[1], message(1))
    assert [p[0] for p in drain(backend, store)] == [4, 5]
    assert store.purge() == 0
    backend.close()


def test_pop_waits_for_the_reservation_only_for_persistent_messages(tmp_path: Path) -> None:
    backend = opened(tmp_path, reservation_min=1, reservation_max=1)
    assert not backend.needs_flush  # open wrote what it had to, synchronously
    assert backend.begin_flush() is None
    store = backend.open_queue("/", "q")
    assert flush(backend)  # the registry entry and a first reservation: id 1
    store.push(message(1), persistent=False)
    popped = store.pop()  # transient: nothing to remember about its delivery
    assert isinstance(popped, tuple)
    assert popped[0] == 1
    store.push(message(2), persistent=True)
    assert store.pop() is FLUSH_FIRST  # beyond the reservation: it must be extended first
    assert backend.needs_flush
    assert store.ready_count == 1
    work = backend.begin_flush()
    assert work is not None
    assert store.pop() is FLUSH_FIRST  # the reservation holds once the flush has completed
    work()
    popped = store.pop()
    assert popped is not None
    assert popped[0] == 2
    assert not popped[2]
    backend.close()


def test_reservation_grows_with_the_delivery_rate(tmp_path: Path) -> None:
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    for n in range(20_000):
        store.push(message(n, b""), persistent=True)
    flush(backend)
    held_back = flushes = 0
    got = []
    while True:
        popped = store.pop()
        if popped is None:
            assert not store.ready_count
            break
        if popped is FLUSH_FIRST:
            held_back += 1
            flush(backend)
            flushes += 1
            continue
        got.append(popped[0])
        if store.wants_flush:
            flush(backend)
            flushes += 1
    assert got == list(range(1, 20_001))
    # Windows of 64, 128, ..., 8192: a handful of pauses, and flushes asked for ahead of need.
    assert held_back <= 2, held_back
    assert flushes <= 20, flushes
    backend.close()


def test_ack_before_the_flush_never_writes_the_message(tmp_path: Path) -> None:
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    assert store.pop() is None  # nothing ready; a consumer is waiting: the next flush reserves
    flush(backend)
    assert not backend.needs_flush
    message_id = store.push(message(1, b"x" * 100_000), persistent=True)
    assert backend.needs_flush
    popped = store.pop()
    assert popped is not None
    assert popped[0] == message_id
    store.ack(message_id)
    # The put and the delete cancelled out: there is nothing left to write.
    assert not backend.needs_flush
    assert backend.begin_flush() is None
    backend.close()
    assert message_key(queue_prefix(1), message_id) not in raw_keys(tmp_path)


def test_flushed_bodies_are_read_back_from_rocksdb(tmp_path: Path) -> None:
    """Once written, a message's body is not kept in memory; recovered queues index their
    messages in an array of 8-byte ids."""
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    for n in range(1000):
        store.push(message(n), persistent=True)
    store.push(message(1000), persistent=False)
    flush(backend)
    popped = pop(backend, store)  # takes in the completed flush
    assert popped is not None
    assert same(popped[1], message(0))
    assert len(store._pending) == 0  # bodies, persistent or not: in RocksDB only
    backend.close()
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    assert store.ready_count == 1000
    assert store._fresh.itemsize == 8
    assert len(store._fresh) + len(store._flagged) == 1000
    assert [p[0] for p in drain(backend, store)] == list(range(1, 1001))
    backend.close()


# --- transient messages ---------------------------------------------------------------------------


def test_transient_bodies_leave_memory_once_flushed(tmp_path: Path) -> None:
    """Transient messages (pika's default) are written to RocksDB like persistent ones: once a
    flush has completed, a durable queue nobody consumes holds no ``Message`` for them, only a run
    of ids; its memory does not grow with its backlog."""
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    flush(backend)
    count = 20_000
    properties = BasicProperties(delivery_mode=1).encode()
    gc.collect()
    messages_before = sum(isinstance(o, Message) for o in gc.get_objects())
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for n in range(count):
            store.push(Message("amq.direct", "rk", properties, bytes(1024)), persistent=False)
            if n % 2000 == 1999:
                flush(backend)  # as the broker's flusher does, a few times a second
        flush(backend)
        assert not backend.needs_flush  # which takes in the completed flush, as the broker polls
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert store._pending == {}
    assert len(store._runs) == 2  # one run of consecutive transient ids: [1, 20001)
    assert not backend.writer.ops
    assert not backend.writer._sealed
    assert not backend.writer._done
    assert sum(isinstance(o, Message) for o in gc.get_objects()) <= messages_before
    # 20 MiB of bodies; what is left is a few dicts' spare capacity (about 0.3 MiB), and it does
    # not grow with the count (kept in memory, the bodies took 23 MiB).
    assert growth < 2 << 20, growth
    assert store.ready_count == count
    keys = live_keys(backend, transient_prefix(store.qid), transient_end(store.qid))
    assert len(keys) == count
    got = [pop(backend, store) for _ in range(3)]
    assert [(p[0], bytes(p[1].body), p[2]) for p in got if p] == [
        (i, bytes(1024), False) for i in (1, 2, 3)
    ]
    backend.close()


class _SyncCountingDb:
    """Wraps the backend's Rdict to count fsyncs (``flush_wal(True)``)."""

    def __init__(self, db: Rdict) -> None:
        self.db = db
        self.syncs = 0

    def flush_wal(self, sync: bool) -> None:
        self.syncs += sync
        self.db.flush_wal(sync)

    def __getattr__(self, name: str) -> object:
        return getattr(self.db, name)


def test_transient_writes_cost_no_fsync_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    flush(backend)  # the registry entry and the first reservation
    assert backend.writer._db is not None
    db = _SyncCountingDb(backend.writer._db)
    monkeypatch.setattr(backend.writer, "_db", db)
    for n in range(100):
        store.push(message(n), persistent=False)
    assert backend.needs_flush  # they must leave memory...
    assert flush(backend)
    assert db.syncs == 0  # ...but nobody waits for their durability
    assert store.purge() == 100  # a range delete of transient keys only
    assert flush(backend)
    assert db.syncs == 0
    persistent = store.push(message(100), persistent=True)
    store.push(message(101), persistent=False)
    assert flush(backend)
    assert db.syncs == 1  # a persistent message is durable once its flush has completed
    prefix = transient_prefix(store.qid)
    assert live_keys(backend, prefix, transient_end(store.qid)) == [
        transient_key(prefix, persistent + 1)
    ]
    backend.close()


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crash"])
def test_transient_records_are_dropped_at_restart(tmp_path: Path, clean: bool) -> None:
    """Written transient messages, ready, unacked or requeued, are on disk until the next
    ``open``, which drops them all, after a clean close or a crash alike; the persistent ones
    around them come back in order, flagged as the contract says."""
    backend = opened(tmp_path, reservation_min=16, reservation_max=16)
    store = backend.open_queue("/", "q")
    pushed = {store.push(message(n), persistent=n % 4 == 0): message(n) for n in range(400)}
    persistent = [i for i in pushed if (i - 1) % 4 == 0]
    flush(backend)
    popped = [p for p in (pop(backend, store) for _ in range(10)) if p]
    assert [p[0] for p in popped] == list(range(1, 11))
    store.requeue(2)  # transient, ready again
    store.requeue(5)  # persistent
    store.ack(3)  # transient
    store.ack(9)  # persistent
    flush(backend)
    if clean:
        backend.close()
    else:
        del backend, store
        gc.collect()
    # The transient records reached the disk (all but the acked one)...
    assert len(transient_keys(raw_keys(tmp_path))) == 299
    backend = opened(tmp_path, reservation_min=16, reservation_max=16)
    assert backend.recovered_cleanly is clean
    store = backend.open_queue("/", "q")
    got = drain(backend, store)
    # ...and are gone: only the persistent messages but the acked one are back.
    assert [i for i, _, _ in got] == [i for i in persistent if i != 9]
    assert all(same(m, pushed[i]) for i, m, _ in got)
    flagged = {i for i, _, flag in got if flag}
    if clean:
        assert flagged == {1, 5}
    else:
        assert {1, 5} <= flagged
        assert all(i <= 16 + 16 for i in flagged)  # within the reservation window
    new = store.push(message(400), persistent=False)
    assert new > max(pushed)
    backend.close()
    # Only the one pushed in this run is left (written at close, dropped by the next open).
    assert transient_keys(raw_keys(tmp_path)) == [transient_key(transient_prefix(1), new)]


def test_transient_records_follow_acks_purges_and_deletes(tmp_path: Path) -> None:
    """Mixed persistence: each message is read from, and deleted under, the right key; purges
    and deleted queues range-delete both kinds; the runs that mark transient ids stay small."""
    backend = opened(tmp_path, reservation_min=8, reservation_max=64)
    store = backend.open_queue("/", "q")
    other = backend.open_queue("/", "other")
    pushed: dict[int, tuple[Message, bool]] = {}
    for n in range(6000):
        persistent = n % 3 == 0
        pushed[store.push(message(n), persistent=persistent)] = (message(n), persistent)
        other.push(message(n), persistent=False)
        if n % 1000 == 999:
            flush(backend)
    assert len(store._runs) == 2 * 2000  # runs of two transient ids
    unacked: set[int] = set()
    for expected in range(1, 4001):
        popped = pop(backend, store)
        assert popped is not None
        message_id, msg, redelivered = popped
        assert (message_id, redelivered) == (expected, False)
        assert same(msg, pushed[message_id][0])
        if message_id % 2 == 0:
            store.ack(message_id)
        else:
            unacked.add(message_id)
    assert len(store._runs) < 4000  # the runs behind the cursor were dropped
    for message_id in [i for i in unacked if i % 5 == 0]:
        store.requeue(message_id)
        unacked.remove(message_id)
    assert store.ready_count == 2000 + 400
    again = pop(backend, store)  # a requeued one first
    assert again is not None
    assert (again[0], again[2]) == (5, True)
    assert same(again[1], pushed[5][0])
    unacked.add(5)
    ready = store.ready_count
    assert store.purge() == ready
    flush(backend)
    assert (store.ready_count, store.unacked_count) == (0, len(unacked))
    on_disk_transient = {
        int.from_bytes(key[-8:], "big")
        for key in live_keys(backend, transient_prefix(store.qid), transient_end(store.qid))
    }
    on_disk_persistent = {
        int.from_bytes(key[-8:], "big")
        for key in live_keys(backend, message_key(queue_prefix(store.qid), 0), queue_end(store.qid))
    }
    assert on_disk_transient == {i for i in unacked if not pushed[i][1]}
    assert on_disk_persistent == {i for i in unacked if pushed[i][1]}
    for message_id in sorted(unacked):
        store.ack(message_id)
    backend.delete_queue("/", "other")
    flush(backend)
    assert live_keys(backend, b"t", b"u") == []
    assert live_keys(backend, queue_prefix(store.qid), queue_end(other.qid)) == [
        reservation_key(queue_prefix(store.qid))
    ]
    backend.close()


# --- restarts ------------------------------------------------------------------------------------


def test_clean_restart_recovers_exactly(tmp_path: Path) -> None:
    backend = opened(tmp_path)
    assert backend.recovered_cleanly is None  # a new database
    store = backend.open_queue("/", "q")
    other = backend.open_queue("vhost", "q")
    pushed = {store.push(message(n), persistent=n % 3 != 0): message(n) for n in range(12)}
    other_id = other.push(message(100), persistent=True)
    flush(backend)
    delivered = [pop(backend, store) for _ in range(6)]  # ids 1..6
    assert [p[0] for p in delivered if p] == [1, 2, 3, 4, 5, 6]
    store.ack(2)  # persistent, acked
    store.ack(4)  # transient, acked
    store.requeue(3)  # persistent, ready again, flagged
    store.requeue(5)
    backend.close()

    backend = opened(tmp_path)
    assert backend.recovered_cleanly is True
    store = backend.open_queue("/", "q")
    # Ids 1, 4, 7, 10 were transient; 2 was acked. Delivered before: 3, 5, 6.
    expected = [(i, i in (3, 5, 6)) for i in (3, 5, 6, 8, 9, 11, 12)]
    assert (store.ready_count, store.unacked_count) == (len(expected), 0)
    got = drain(backend, store)
    assert [(i, flag) for i, _, flag in got] == expected
    assert all(same(m, pushed[i]) for i, m, _ in got)
    assert store.push(message(13), persistent=True) > 12  # ids are never reused
    other = backend.open_queue("vhost", "q")
    (only,) = drain(backend, other)
    assert only[0] == other_id
    assert same(only[1], message(100))
    assert not only[2]
    backend.close()


def test_deleted_queue_leaves_no_keys(tmp_path: Path) -> None:
    backend = opened(tmp_path)
    doomed = backend.open_queue("/", "doomed")
    kept = backend.open_queue("/", "kept")
    for n in range(50):
        doomed.push(message(n), persistent=True)
    kept.push(message(1), persistent=True)
    flush(backend)
    drain(backend, doomed)
    backend.delete_queue("/", "doomed")
    flush(backend)
    backend.close()
    keys = raw_keys(tmp_path)
    assert not [k for k in keys if queue_prefix(1) <= k < queue_end(1)]
    assert registry_key("/", "doomed") not in keys
    assert registry_key("/", "kept") in keys
    assert message_key(queue_prefix(2), 1) in keys
    backend = opened(tmp_path)
    again = backend.open_queue("/", "doomed")
    assert (again.ready_count, again.unacked_count) == (0, 0)
    assert again.qid == 3  # queue ids are never reused either
    backend.close()


def test_refuses_a_database_that_is_not_its_own(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path / "rocksdb"), Options(raw_mode=True))
    db[b"someone else's"] = b"data"
    db.close()
    with pytest.raises(RuntimeError, match="not tqbroker's"):
        RocksDBBackend().open(tmp_path)


def test_refuses_a_database_of_the_format_without_timestamps(tmp_path: Path) -> None:
    RocksDBBackend().open(tmp_path)  # creates it: then pretend an older version did
    db = Rdict(str(tmp_path / "rocksdb"), Options(raw_mode=True))
    db[b"\x00format"] = b"1"
    db.close()
    with pytest.raises(RuntimeError, match="unsupported format"):
        RocksDBBackend().open(tmp_path)


def test_a_vanished_record_is_skipped_and_ready_bytes_heals(tmp_path: Path) -> None:
    """A record missing from the database (only damage can do that) is skipped by ``peek`` and
    ``pop``; its size is unknown, but ``ready_bytes`` is 0 again once nothing is ready."""
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    ids = [store.push(message(n, b"x" * 10), persistent=True) for n in range(3)]
    first = pop(backend, store)
    assert first is not None
    store.requeue(first[0])
    flush(backend)
    assert not backend.needs_flush  # takes in the flush: bodies are read from RocksDB now
    assert backend.writer._db is not None
    backend.writer._db.delete(message_key(queue_prefix(store.qid), ids[0]))
    peeked = store.peek()
    assert isinstance(peeked, tuple)
    assert peeked[0] == ids[1]
    assert [p[0] for p in drain(backend, store)] == ids[1:]
    assert (store.ready_count, store.ready_bytes) == (0, 0)
    backend.close()


def test_crash_in_process_keeps_flushed_and_flags_a_bounded_window(tmp_path: Path) -> None:
    """Dropping the backend without ``close`` (the flush of the last batch never happens): what
    was flushed is back; delivered messages are flagged, and so is the rest of the reservation
    window (4 here), nothing beyond it."""
    backend = opened(tmp_path, reservation_min=4, reservation_max=4)
    store = backend.open_queue("/", "q")
    ids = [store.push(message(n), persistent=True) for n in range(20)]
    flush(backend)  # with open_queue's reservation: ids 1..4
    for n in range(3):
        popped = store.pop()
        assert isinstance(popped, tuple)
        assert popped[0] == ids[n]
    store.ack(ids[0])  # not flushed: comes back, flagged
    store.push(message(20), persistent=True)  # not flushed: lost
    store.push(message(21), persistent=False)
    del backend, store, popped
    gc.collect()
    backend = opened(tmp_path, reservation_min=4, reservation_max=4)
    assert backend.recovered_cleanly is False
    store = backend.open_queue("/", "q")
    got = drain(backend, store)
    assert [(i, flag) for i, _, flag in got] == [(i, i <= 4) for i in ids]
    backend.close()


# --- flushes in another thread ------------------------------------------------------------------


def test_flushes_in_a_worker_thread_while_pushing(tmp_path: Path) -> None:
    """The broker runs flush work in a worker thread while the Trio thread pushes, pops and
    acks: nothing is lost or duplicated, and the delivery flags come back exact."""
    backend = opened(tmp_path, reservation_min=16, reservation_max=256)
    store = backend.open_queue("/", "q")
    work_queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
    errors: list[BaseException] = []
    in_flush = threading.Event()
    overlapped = threading.Event()  # a push happened during a flush
    completed: list[int] = []

    def worker() -> None:
        try:
            while (work := work_queue.get()) is not None:
                in_flush.set()
                if not completed:  # the first flush waits for a push (however busy the machine)
                    overlapped.wait(timeout=10)
                work()
                in_flush.clear()
                completed.append(1)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    persistent: dict[int, Message] = {}
    acked: set[int] = set()
    delivered: list[int] = []
    pushes_during_flushes = 0
    try:
        for n in range(6000):
            msg = message(n, os.urandom(n % 300))
            is_persistent = n % 5 != 0
            message_id = store.push(msg, persistent=is_persistent)
            if is_persistent:
                persistent[message_id] = msg
            if in_flush.is_set():
                pushes_during_flushes += 1
                overlapped.set()
            if n % 3 == 0:
                popped = store.pop()  # never blocks: a held-back pop just waits for a flush
                if popped is not None and popped is not FLUSH_FIRST:
                    delivered.append(popped[0])
                    if popped[0] % 2 == 0:
                        store.ack(popped[0])
                        acked.add(popped[0])
            if n % 40 == 0 or store.wants_flush:
                work = backend.begin_flush()
                if work is not None:
                    work_queue.put(work)
    finally:
        work_queue.put(None)
        thread.join()
    assert not errors, errors
    assert backend.healthy
    assert pushes_during_flushes > 0, "no flush overlapped the pushes: the test proves nothing"
    assert len(completed) > 10
    assert delivered == sorted(set(delivered))
    backend.close()

    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    got = drain(backend, store)
    expected = sorted(set(persistent) - acked)
    assert [i for i, _, _ in got] == expected
    assert all(same(m, persistent[i]) for i, m, _ in got)
    assert [i for i, _, flag in got if flag] == [i for i in expected if i in set(delivered)]
    backend.close()


# --- a killed process -----------------------------------------------------------------------------

_SIGKILL_CHILD = """
import json, os, signal, sys
from pathlib import Path
from tqbroker.backends import FLUSH_FIRST, Message
from tqbroker_rocksdb import RocksDBBackend

data_dir, state_file = Path(sys.argv[1]), Path(sys.argv[2])
def msg(n): return Message("ex", f"rk.{n}", b"\\x00\\x00", b"body %d" % n)
def flush(b):
    work = b.begin_flush()
    if work: work()
def pop(b, s):
    got = s.pop()
    if got is FLUSH_FIRST:
        flush(b)
        got = s.pop()
    return got

backend = RocksDBBackend(reservation_min=8, reservation_max=8)
backend.open(data_dir)
store = backend.open_queue("/", "q")
flushed = [store.push(msg(n), persistent=True) for n in range(100)]
transient = [store.push(msg(n), persistent=False) for n in range(100, 105)]
flush(backend)
popped = [pop(backend, store)[0] for _ in range(5)]
store.ack(popped[0])
store.requeue(popped[1])
flush(backend)  # the ack is durable now
transient += [store.push(msg(n), persistent=False) for n in range(200, 205)]
flush(backend)  # written to RocksDB too
store.ack(popped[2])  # not flushed: may come back
unflushed = [store.push(msg(n), persistent=True) for n in range(105, 110)]
state = {
    "flushed": flushed, "transient": transient, "unflushed": unflushed, "popped": popped,
    "reserved": store.reservation.target,  # every reservation made was flushed: durable
}
state_file.write_text(json.dumps(state))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkill_after_a_flush_loses_nothing_flushed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    child = run_child(_SIGKILL_CHILD, data_dir, tmp_path)
    assert child.returncode == -signal.SIGKILL, child.stderr
    state = json.loads((tmp_path / "state.json").read_text())
    popped = state["popped"]
    assert len(transient_keys(raw_keys(data_dir))) == 10  # the transient ones reached the disk
    backend = opened(data_dir)
    assert backend.recovered_cleanly is False
    store = backend.open_queue("/", "q")
    got = drain(backend, store)
    ids = [i for i, _, _ in got]
    assert ids == sorted(ids)
    # Every flushed persistent message but the one acked before the last flush; nothing else
    # (transient ones are gone; unflushed ones were never written).
    assert set(ids) - {popped[2]} == set(state["flushed"]) - {popped[0], popped[2]}
    assert not set(ids) & set(state["transient"] + state["unflushed"])
    for message_id, msg, _ in got:
        assert msg.body == b"body %d" % (message_id - 1)
    flagged = [i for i, _, flag in got if flag]
    # Delivered ones are flagged; never-delivered ones only within the durable reservation.
    assert (set(popped) - {popped[0]}) & set(ids) <= set(flagged)
    assert all(i < state["reserved"] for i in flagged)
    assert store.push(Message("ex", "rk", b"\x00\x00", b""), persistent=True) > max(
        state["unflushed"]
    )
    backend.close()
    assert transient_keys(raw_keys(data_dir)) == []


# --- a failing disk ------------------------------------------------------------------------------

_WRITE_FAILURE_CHILD = """
import json, resource, signal, sys
from pathlib import Path
from tqbroker.backends import FLUSH_FIRST, Message
from tqbroker_rocksdb import RocksDBBackend

data_dir, state_file = Path(sys.argv[1]), Path(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
report = {}
backend = RocksDBBackend()
backend.open(data_dir)
store = backend.open_queue("/", "q")
store.push(Message("ex", "small", b"\\x00\\x00", b"small"), persistent=True)
backend.begin_flush()()  # the message, and open_queue's first delivery reservation
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, hard))
store.push(Message("ex", "big", b"\\x00\\x00", b"x" * (1 << 20)), persistent=True)
work = backend.begin_flush()
try:
    work()
except OSError as exc:
    report["error"] = str(exc)
report["healthy_after_failure"] = backend.healthy
report["needs_flush_after_failure"] = backend.needs_flush
got = store.pop()  # reads still work
report["popped_while_failing"] = got[1].routing_key if got else None
store.requeue(got[0])
work = backend.begin_flush()
try:
    work()
except OSError as exc:
    report["still_failing"] = str(exc)
report["healthy_still_failing"] = backend.healthy
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
backend.begin_flush()()
report["healthy_after_recovery"] = backend.healthy
backend.close()
backend = RocksDBBackend()
backend.open(data_dir)
store = backend.open_queue("/", "q")
report["recovered"] = []
while True:
    got = store.pop()
    if got is None:
        break
    if got is FLUSH_FIRST:
        backend.begin_flush()()
        continue
    report["recovered"].append([got[0], got[1].routing_key, len(got[1].body), got[2]])
backend.close()
state_file.write_text(json.dumps(report))
"""


def test_failed_write_is_reported_and_retried(tmp_path: Path) -> None:
    """A real write failure (RLIMIT_FSIZE makes RocksDB's WAL append fail with EFBIG): the flush
    raises OSError, the backend is unhealthy and keeps needing a flush; once the disk accepts
    writes again the next flush reopens RocksDB, writes everything the failed flushes held and
    reports healthy; nothing is lost."""
    data_dir = tmp_path / "data"
    child = run_child(_WRITE_FAILURE_CHILD, data_dir, tmp_path)
    assert child.returncode == 0, child.stderr
    report = json.loads((tmp_path / "state.json").read_text())
    assert "File too large" in report["error"]
    assert report["healthy_after_failure"] is False
    assert report["needs_flush_after_failure"] is True
    assert report["popped_while_failing"] == "small"
    assert "still_failing" in report
    assert report["healthy_still_failing"] is False
    assert report["healthy_after_recovery"] is True
    assert report["recovered"] == [[1, "small", 5, True], [2, "big", 1 << 20, False]]
