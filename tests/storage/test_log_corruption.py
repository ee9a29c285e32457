"""Bit rot in a sealed segment: one flipped bit anywhere in a record (its length, CRC, header
fields or body) makes that record unreadable, and only that one. ``LogReader.read`` returns None for
it (logged with the file and offset, counted in ``corrupt_records``) and never a corrupted body;
every other record still reads back byte for byte, before and after a restart; a consumer of a
queue on the ``log`` backend gets every other message and never the corrupted one."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from tests.support.storage import flush
from tqbroker.backends import FLUSH_FIRST
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.log import Log
from tqbroker.backends.log.store import LogQueueStore
from tqbroker.model import Message
from tqbroker.protocol.methods import BasicProperties

from .logdata import (
    INDEX_INTERVAL,
    SEGMENT_BYTES,
    T0,
    Expected,
    append_random,
    as_expected,
    first_at_or_after,
    open_log,
    record_bounds,
    sync,
)

# (name, byte position within the record or a callable of the record size, bit)
SPOTS: dict[str, tuple[int | str, int]] = {
    "length-low-bit": (3, 0),  # the record seems 1 byte longer or shorter
    "length-bit-9": (2, 1),  # 512 bytes off: past the next index entry
    "length-high-bit": (0, 7),  # an impossible length
    "crc": (5, 3),
    "offset": (15, 0),
    "timestamp": (20, 6),
    "flags": (24, 1),
    "exchange-length": (25, 2),
    "body-middle": ("middle", 4),
    "body-last-byte": ("last", 7),
}
VICTIMS = ["first", "middle", "last"]  # which record of the sealed segment


def flip(path: Path, start: int, end: int, spot: str) -> None:
    where, bit = SPOTS[spot]
    if where == "middle":
        pos = start + (end - start) // 2 + 20  # the body is the tail of a record
    elif where == "last":
        pos = end - 1
    else:
        assert isinstance(where, int)
        pos = start + where
    assert start <= pos < end
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ (1 << bit)]))


def pick_victim(log: Log, which: str) -> tuple[Path, int, int, int]:
    """A record of the second segment (sealed): its file, byte range and offset."""
    segment = log.segments[1]
    bounds = record_bounds(segment.log_path)
    i = {"first": 0, "middle": len(bounds) // 2, "last": len(bounds) - 1}[which]
    start, end = bounds[i]
    return segment.log_path, start, end, segment.base_offset + i


def build(tmp_path: Path, rng: random.Random) -> tuple[Log, list[Expected], int]:
    log, _ = open_log(tmp_path)
    # Bodies of at least 40 bytes: "middle" lands in the body of every record.
    expected: list[Expected] = []
    ts = T0
    while len(log.segments) < 4:
        more, ts = append_random(log, rng, 1, ts, min_body=40)
        expected += more
    sync(log)
    return log, expected, ts


@pytest.mark.parametrize("reopen", ["live", "clean-restart", "crash-restart"])
@pytest.mark.parametrize("which", VICTIMS)
@pytest.mark.parametrize("spot", list(SPOTS))
def test_flipped_bit_in_a_sealed_segment_loses_only_that_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spot: str, which: str, reopen: str
) -> None:
    rng = random.Random(f"{spot}-{which}-{reopen}")
    log, expected, ts = build(tmp_path, rng)
    path, start, end, victim = pick_victim(log, which)
    size_before = path.stat().st_size
    if reopen == "live":
        flip(path, start, end, spot)
    else:
        log.close(clean=reopen == "clean-restart")
        flip(path, start, end, spot)
        # After a crash only the active segment is rescanned (the rest was fsync'd).
        log, clean = open_log(tmp_path, recovery_point=len(expected))
        assert clean == (reopen == "clean-restart")
    # A sealed segment is never cut because of a flipped bit, and nothing after it is lost.
    assert path.stat().st_size == size_before
    assert log.next_offset == len(expected)

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="tqbroker.backends.log"):
        for want in expected:
            got = as_expected(log.reader.read(want.offset))
            if want.offset == victim:
                assert got is None
            else:
                assert got == want, f"offset {want.offset} (victim {victim})"
    assert log.reader.corrupt_records == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert str(path) in errors[0]
    assert f"offset {victim}" in errors[0]

    # Reading it again logs and counts again; it never comes back.
    assert log.reader.read(victim) is None
    assert log.reader.corrupt_records == 2

    # Timestamp lookups step over the damaged record.
    for want in expected[::3]:
        for t in (want.timestamp_ms, want.timestamp_ms + 1):
            found = log.reader.offset_for_timestamp(t)
            without = [e for e in expected if e.offset != victim]
            assert found in (first_at_or_after(expected, t), first_at_or_after(without, t))

    # The log goes on: appends continue at the right offset, and a clean restart keeps all this.
    more, _ = append_random(log, rng, 5, ts)
    assert more[0].offset == len(expected)
    sync(log)
    log.close(clean=True)
    log, clean = open_log(tmp_path)
    assert clean
    assert path.stat().st_size == size_before
    for want in expected + more:
        got = as_expected(log.reader.read(want.offset))
        assert got == (None if want.offset == victim else want)
    log.close(clean=True)


# -- through the queue store ---------------------------------------------------------------------

QUEUE = ("/", "bitrot")


def new_backend(data_dir: Path) -> LogBackend:
    backend = LogBackend(segment_bytes=SEGMENT_BYTES, index_interval_bytes=INDEX_INTERVAL)
    backend.open(data_dir)
    return backend


def drain(backend: LogBackend, store: LogQueueStore, *, requeue_every: int = 0) -> list[bytes]:
    """Pop (flushing when the store asks to) and ack everything; requeue every n-th delivery
    once first."""
    bodies: list[bytes] = []
    requeued: set[int] = set()
    while True:
        entry = store.pop()
        if entry is None:
            return bodies
        if entry is FLUSH_FIRST:
            flush(backend)  # the delivery reservation must be extended first
            continue
        message_id, message, _redelivered = entry
        if requeue_every and message_id % requeue_every == 0 and message_id not in requeued:
            requeued.add(message_id)
            store.requeue(message_id)
            continue
        bodies.append(message.body)
        store.ack(message_id)


def publish_bodies(store: LogQueueStore, count: int) -> list[bytes]:
    properties = BasicProperties(delivery_mode=2).encode()
    bodies = []
    for i in range(count):
        body = f"message {i:04d} ".encode() + bytes([i % 251]) * (60 + (i * 37) % 200)
        store.push(Message("", QUEUE[1], properties, body), persistent=True)
        bodies.append(body)
    return bodies


@pytest.mark.parametrize("restart", ["clean", "crash", "none"])
@pytest.mark.parametrize("spot", ["length-low-bit", "length-bit-9", "crc", "body-middle"])
@pytest.mark.parametrize("which", VICTIMS)
def test_consumer_gets_every_message_but_the_corrupt_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, restart: str, spot: str, which: str
) -> None:
    backend = new_backend(tmp_path)
    store = backend.open_queue(*QUEUE)
    bodies = publish_bodies(store, 120)
    flush(backend)
    assert len(store.log.segments) >= 4
    path, start, end, victim = pick_victim(store.log, which)
    if restart == "none":
        flip(path, start, end, spot)
    else:
        if restart == "clean":
            backend.close()
        else:
            store.log.close(clean=False)  # a crash after the last flush: no clean marker
        flip(path, start, end, spot)
        backend = new_backend(tmp_path)
        store = backend.open_queue(*QUEUE)
    assert store.ready_count == len(bodies)

    with caplog.at_level(logging.ERROR, logger="tqbroker.backends.log"):
        got = drain(backend, store, requeue_every=7)
    assert got == bodies[:victim] + bodies[victim + 1 :]
    assert store.log.reader.corrupt_records == 1
    assert any(str(path) in r.getMessage() for r in caplog.records)
    assert (store.ready_count, store.unacked_count) == (0, 0)

    # Everything is settled, the corrupt record included: nothing comes back after a restart.
    flush(backend)
    backend.close()
    backend = new_backend(tmp_path)
    store = backend.open_queue(*QUEUE)
    assert store.ready_count == 0
    assert store.pop() is None
    backend.close()
