"""What the conformance suite cannot see of the ``log`` backend: record timestamps (the message's,
else the time of the append) from the cache and from disk, the time index with timestamps out of
order, transient records that reached the disk before a crash, and ``ready_bytes``/``peek`` when a
record turns out damaged."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.support.storage import flush
from tqbroker.backends import FLUSH_FIRST, FlushFirst
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.cache import RecordCache
from tqbroker.backends.log.format import decode_record
from tqbroker.backends.log.log import Log
from tqbroker.backends.log.store import LogQueueStore
from tqbroker.model import Message

T0 = 1_700_000_000_000


def message(n: int, *, size: int = 10, timestamp_ms: int = T0) -> Message:
    body = (b"%d:" % n).ljust(size, b".")
    return Message("ex", f"rk.{n}", b"\x00\x00", body, timestamp_ms=timestamp_ms)


def opened(
    data_dir: Path, *, cache_bytes: int = 1 << 20, segment_bytes: int = 1 << 26
) -> LogBackend:
    backend = LogBackend(cache_bytes=cache_bytes, segment_bytes=segment_bytes)
    backend.open(data_dir)
    return backend


def crash(backend: LogBackend) -> None:
    """Stop without ``close``: what was written out stays, buffers are lost."""
    for store in backend._stores():
        store.log.close(clean=False)


Popped = tuple[int, Message, bool]


def fields(item: Popped | FlushFirst | None) -> tuple[object, ...] | None:
    if item is None:
        return None
    assert item is not FLUSH_FIRST
    message_id, m, redelivered = item
    return message_id, redelivered, m.exchange, m.routing_key, m.body, m.timestamp_ms


def drain(backend: LogBackend, store: LogQueueStore) -> list[Popped]:
    """Peek then pop everything (flushing when a reservation is needed)."""
    popped: list[Popped] = []
    while store.ready_count:
        peeked = store.peek()
        if peeked is FLUSH_FIRST:
            flush(backend)
            continue
        assert peeked is not None
        assert fields(store.pop()) == fields(peeked)
        popped.append(peeked)
    assert store.peek() is None
    assert store.pop() is None
    assert store.ready_bytes == 0
    return popped


# -- timestamps ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20], ids=["from-disk", "from-cache"])
def test_records_carry_the_message_timestamp(tmp_path: Path, cache_bytes: int) -> None:
    log = Log(tmp_path, cache=RecordCache(cache_bytes))
    log.open()
    before = time.time_ns() // 1_000_000
    offsets = [
        log.append(message(0, timestamp_ms=T0 + 5), 1),
        log.append(message(1, timestamp_ms=T0), 1),  # older than the one before
        log.append(message(2, timestamp_ms=0), 1),  # never stamped: now
        log.append(message(3, timestamp_ms=T0), 1, timestamp_ms=T0 + 9),  # explicit: wins
    ]
    after = time.time_ns() // 1_000_000
    records = [log.reader.read(offset) for offset in offsets]
    stamps = [record.timestamp_ms for record in records if record is not None]
    assert stamps[:2] == [T0 + 5, T0]
    assert before <= stamps[2] <= after
    assert stamps[3] == T0 + 9
    for record in records:
        assert record is not None
        assert record.message.timestamp_ms == record.timestamp_ms
    log.write_out()
    log.close(clean=True)
    log = Log(tmp_path)
    log.open()
    assert [r.timestamp_ms for r in map(log.reader.read, offsets) if r is not None] == stamps
    log.close(clean=True)


@pytest.mark.parametrize("reopen", ["live", "clean", "crash"])
def test_time_index_finds_the_first_record_at_or_after_with_timestamps_out_of_order(
    tmp_path: Path, reopen: str
) -> None:
    rng = random.Random(reopen)
    log = Log(tmp_path, segment_bytes=4096, index_interval_bytes=256)
    log.open()
    stamps = [T0 + rng.randint(0, 2000) for _ in range(400)]
    for n, stamp in enumerate(stamps):
        log.append(message(n, size=rng.randint(0, 60), timestamp_ms=stamp), 1)
    log.write_out()
    if reopen != "live":
        log.close(clean=reopen == "clean")
        log = Log(tmp_path, segment_bytes=4096, index_interval_bytes=256)
        assert log.open() == (reopen == "clean")
    assert len(log.segments) > 5
    for t in range(T0 - 1, T0 + 2002, 7):
        expected = next((n for n, stamp in enumerate(stamps) if stamp >= t), len(stamps))
        assert log.reader.offset_for_timestamp(t) == expected, t
    for segment in log.segments:  # the time index is strictly increasing
        assert list(segment.time_index.keys) == sorted(set(segment.time_index.keys))
    log.close(clean=True)


def test_store_gives_back_timestamps_before_and_after_a_restart(tmp_path: Path) -> None:
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    stamps = [T0, T0 - 1000, 1, T0 + 3]
    for n, stamp in enumerate(stamps):
        store.push(message(n, timestamp_ms=stamp), persistent=True)
    assert [m.timestamp_ms for _, m, _ in drain(backend, store)] == stamps
    backend.close()
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    assert [m.timestamp_ms for _, m, _ in drain(backend, store)] == stamps
    backend.close()


# -- ready bytes and peek --------------------------------------------------------------------------


def test_transient_records_written_before_a_crash_are_dropped_at_open(tmp_path: Path) -> None:
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    kept = [message(n, size=100) for n in range(3)]
    for m in kept:
        store.push(m, persistent=True)
    flush(backend)
    for n in range(8):  # 1 MiB: written out (not flushed) before the crash
        store.push(message(n, size=1 << 17), persistent=False)
    assert store.log.segments[-1].written > 1 << 19
    crash(backend)
    backend = opened(tmp_path)
    store = backend.open_queue("/", "q")
    assert (store.ready_count, store.ready_bytes) == (3, 300)
    assert [m.body for _, m, _ in drain(backend, store)] == [m.body for m in kept]
    backend.close()


def flip_body_bit(path: Path, offset: int) -> None:
    """Damage the body of the record at ``offset`` in the segment file ``path``."""
    data = bytearray(path.read_bytes())
    pos = 0
    while (record := decode_record(data, pos)) is not None and record.offset != offset:
        pos += record.size
    assert record is not None
    data[pos + record.size - 1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("restart", ["none", "clean", "crash"])
@pytest.mark.parametrize("victim", [0, 2, 3])  # of the first segment, sealed
def test_a_damaged_record_leaves_ready_bytes_exact(
    tmp_path: Path, restart: str, victim: int
) -> None:
    backend = opened(tmp_path, cache_bytes=0, segment_bytes=256)
    store = backend.open_queue("/", "q")
    messages = [message(n, size=10 * (n + 1)) for n in range(10)]
    ids = [store.push(m, persistent=True) for m in messages]
    flush(backend)
    assert store.log.segments[1].base_offset == 4
    path = store.log.segments[0].log_path
    if restart == "none":
        flip_body_bit(path, ids[victim])
    else:
        if restart == "clean":
            backend.close()
        else:
            crash(backend)
        flip_body_bit(path, ids[victim])
        backend = opened(tmp_path, cache_bytes=0, segment_bytes=256)
        store = backend.open_queue("/", "q")
    # The damaged record is only found out when it is reached: until then it counts.
    sizes = [len(m.body) for m in messages]
    assert store.ready_count == 10
    if restart != "crash":  # a crash counts by reading the records: the damaged one is 0
        assert store.ready_bytes == sum(sizes)
    popped = store.pop()
    assert isinstance(popped, tuple)
    store.requeue(popped[0])
    got = drain(backend, store)
    assert [m.body for _, m, _ in got] == [m.body for n, m in enumerate(messages) if n != victim]
    assert store.log.reader.corrupt_records >= 1
    for message_id, _, _ in got:
        store.ack(message_id)
    assert (store.ready_count, store.unacked_count, store.ready_bytes) == (0, 0, 0)
    backend.close()


def test_peek_settles_a_damaged_head_and_shows_the_next_message(tmp_path: Path) -> None:
    backend = opened(tmp_path, cache_bytes=0)
    store = backend.open_queue("/", "q")
    ids = [store.push(message(n, size=50), persistent=True) for n in range(3)]
    flush(backend)
    flip_body_bit(store.log.segments[0].log_path, ids[0])
    peeked = store.peek()
    assert isinstance(peeked, tuple)
    assert peeked[0] == ids[1]
    assert (store.ready_count, store.unacked_count, store.ready_bytes) == (2, 0, 100)
    assert fields(store.peek()) == fields(peeked)
    assert fields(store.pop()) == fields(peeked)
    backend.close()
