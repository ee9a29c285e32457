"""The log backend's side of the replication primitives, beyond the conformance cases
(``tqbroker.testing.conformance.cases_streams``): what is on disk when, the truncation's intent
finished by a start, a flush in flight across a truncation, producer states stored before
epochs, and the empty segment recovery removes from the end of a stream."""

from __future__ import annotations

from pathlib import Path

import cbor2
import pytest

from tests.support.storage import flush
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.epochs import EPOCH_FILE
from tqbroker.backends.log.replication import TRUNCATE_FILE, Intent, write_intent
from tqbroker.backends.log.stream import LogStream
from tqbroker.backends.log.streamstate import STATE_FILE
from tqbroker.backends.streams import CorruptLogError, ProducerState, truncate
from tqbroker.model import Message


def _open(root: Path, segment_bytes: int = 1 << 20) -> tuple[LogBackend, LogStream]:
    backend = LogBackend(segment_bytes=segment_bytes, index_interval_bytes=256)
    backend.open(root)
    stream = backend.open_stream("/", "s")
    assert isinstance(stream, LogStream)
    return backend, stream


def _fill(backend: LogBackend, stream: LogStream, count: int, tag: bytes = b"r") -> None:
    for n in range(count):
        stream.append(Message("", "k", b"", tag + b"%d" % n, timestamp_ms=1_000 + n))
        stream.seal()  # a frame per record
    flush(backend)


def test_an_epoch_is_on_disk_before_its_first_frame_is_appended(tmp_path: Path) -> None:
    backend, leader = _open(tmp_path / "a")
    follower_backend, follower = _open(tmp_path / "b")
    _fill(backend, leader, 5)
    frames, _next = leader.read_frames(0, 5, 1 << 20)
    follower.append_frames(frames, 7)
    stored = cbor2.loads((follower.directory / EPOCH_FILE).read_bytes())
    assert stored == [[7, 0]]
    assert follower.durable_end == 0  # the frames wait for the flush; the epoch did not
    backend.close()
    follower_backend.close()


def test_a_start_finishes_a_truncation_a_crash_interrupted(tmp_path: Path) -> None:
    backend, stream = _open(tmp_path, segment_bytes=300)
    stream.begin_epoch(1)
    _fill(backend, stream, 20)
    stream.begin_epoch(2)
    _fill(backend, stream, 5, b"s")
    stream.store_offset("c", 22)
    flush(backend)
    # as if a power cut came right after the intent
    write_intent(stream.env, stream.directory, Intent(12))
    backend.close()
    backend, stream = _open(tmp_path, segment_bytes=300)
    assert (stream.next_offset, stream.durable_end) == (12, 12)
    assert stream.read(11) is not None
    assert stream.read(12) is None
    assert stream.epoch_history == [(1, 0)]
    assert stream.offsets["c"] == 12
    assert not (stream.directory / TRUNCATE_FILE).exists()
    assert cbor2.loads((stream.directory / STATE_FILE).read_bytes())["recovery_point"] <= 12
    backend.close()


def test_a_flush_begun_before_a_truncation_writes_nothing_stale(tmp_path: Path) -> None:
    """A flush's work in flight while the log is cut back must not move ``durable_end`` (or
    the stored recovery point) past the new end afterwards."""
    backend, stream = _open(tmp_path)
    _fill(backend, stream, 10)
    stream.append(Message("", "k", b"", b"late", timestamp_ms=5))
    stream.store_offset("c", 3)  # the flush will write stream.cbor
    work = backend.begin_flush()
    assert work is not None
    truncate(stream, 4)
    work()
    assert (stream.next_offset, stream.durable_end) == (4, 4)
    assert cbor2.loads((stream.directory / STATE_FILE).read_bytes())["recovery_point"] <= 4
    _fill(backend, stream, 3, b"n")
    assert [bytes(r.message.body) for r in stream.read_many(0, 10, 10)][-3:] == [
        b"n0",
        b"n1",
        b"n2",
    ]
    backend.close()


def test_no_flush_begins_while_a_truncation_runs(tmp_path: Path) -> None:
    """From ``begin_truncation`` until its last step ends, no flush begins and neither
    retention nor compaction plans anything (the broker runs the blocking steps in a worker
    thread, the Trio thread free meanwhile); afterwards the flush does what waited."""
    backend, stream = _open(tmp_path)
    for _ in range(4):
        stream.append(Message("", "k", b"", b"x", timestamp_ms=5))
        flush(backend)
    stream.append(Message("", "k", b"", b"y", timestamp_ms=5))  # not flushed
    steps = stream.begin_truncation(2)
    assert steps is not None
    for step in steps:
        assert stream.begin_flush() is None
        assert stream.apply_retention(max_bytes=0, max_age_ms=None, now_ms=10) == 0
        step()
    assert stream.next_offset == 2
    stream.append(Message("", "k", b"", b"z", timestamp_ms=5))
    flush(backend)  # the gate is open again
    assert stream.durable_end == 3
    backend.close()


def test_a_failed_truncation_step_releases_the_flush(tmp_path: Path) -> None:
    """A step that raises ``OSError`` ends the truncation: flushes begin again, and the next
    open finishes the truncation from its intent."""
    backend, stream = _open(tmp_path)
    for _ in range(4):
        stream.append(Message("", "k", b"", b"x", timestamp_ms=5))
        flush(backend)
    steps = stream.begin_truncation(1)
    assert steps is not None
    steps.prepare()
    steps.cut()
    directory = stream.directory
    (directory / STATE_FILE).mkdir()  # stream.cbor cannot be replaced: the last step fails
    with pytest.raises(IsADirectoryError):
        steps.finish()
    assert not stream.truncating
    (directory / STATE_FILE).rmdir()
    assert (directory / TRUNCATE_FILE).exists()
    backend.close()
    backend, stream = _open(tmp_path)
    assert stream.next_offset == 1
    assert not (directory / TRUNCATE_FILE).exists()
    backend.close()


def test_producer_states_stored_before_epochs_read_as_epoch_0(tmp_path: Path) -> None:
    backend, stream = _open(tmp_path)
    directory = stream.directory
    backend.close()
    (directory / STATE_FILE).write_bytes(cbor2.dumps({"recovery_point": 0, "producers": {"p": 42}}))
    backend, stream = _open(tmp_path)
    assert stream.producers == {"p": ProducerState(0, 42)}
    stream.record_producer("p", 2, 50)
    flush(backend)
    stored = cbor2.loads((directory / STATE_FILE).read_bytes())
    assert stored["producers"] == {"p": [2, 50]}
    backend.close()


def test_recovery_removes_an_empty_segment_after_a_hole(tmp_path: Path) -> None:
    """A crash kept a segment rolled to, not the record buffered before the roll: the stream
    ends where its records do, no offset skipped."""
    backend, stream = _open(tmp_path, segment_bytes=300)
    _fill(backend, stream, 6)
    segments = sorted(stream.directory.glob("*.log"))
    directory = stream.directory
    end = stream.next_offset
    backend.close()
    last = segments[-1]
    # An empty segment past the end, as a roll leaves it before anything is written there.
    hole = end + 1
    for suffix in (".log", ".index", ".timeindex"):
        (directory / f"{hole:020d}{suffix}").write_bytes(b"")
    (directory / "clean-shutdown").unlink()
    assert last.exists()
    backend, stream = _open(tmp_path, segment_bytes=300)
    assert stream.next_offset == end
    assert not (directory / f"{hole:020d}.log").exists()
    backend.close()


def test_a_search_by_time_over_a_damaged_frame_fails_the_stream(tmp_path: Path) -> None:
    backend = LogBackend(index_interval_bytes=1 << 20)  # one index entry: the search walks
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    assert isinstance(stream, LogStream)
    for n in range(20):
        stream.append(Message("", "k", b"", b"body-%02d" % n, timestamp_ms=1_000 + n))
        stream.seal()
    flush(backend)
    (path,) = sorted(stream.directory.glob("*.log"))
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"body-05") + 3] ^= 1
    path.write_bytes(bytes(raw))
    stream.log.segments[0]._read_pos = -1  # forget the read-ahead
    with pytest.raises(CorruptLogError):
        stream.offset_for_timestamp(1_010)
    assert stream.failure is not None
    backend.close()
