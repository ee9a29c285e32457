"""Frame reads (``StreamLog.read_frames``, ``backends/log/frames.py``): the frames a bulk reader
gets as they lie on disk hold exactly the records a record-by-record read gives, in order and
once each, whatever the range, the byte budget, the mix of batches and single records (format 1
logs, compacted segments), the segments' boundaries and the gaps between offsets; a damaged
frame fails the stream (strict reads: ``CorruptLogError``), never stepped over."""

from __future__ import annotations

import errno
import logging
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.storage import flush
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.format import decode_frame
from tqbroker.backends.log.stream import LogStream
from tqbroker.backends.streams import CompactionPolicy, CorruptLogError
from tqbroker.model import Message

FORMAT1 = Path(__file__).resolve().parents[1] / "data" / "stream-log-format1"

Row = tuple[int, str, bytes]  # offset, routing key, body


def _open(
    root: Path, segment_bytes: int = 1 << 20, index_interval_bytes: int = 256
) -> tuple[LogBackend, LogStream]:
    backend = LogBackend(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes)
    backend.open(root)
    stream = backend.open_stream("/", "s")
    assert isinstance(stream, LogStream)
    return backend, stream


def _expected(stream: LogStream, start: int, end: int) -> list[Row]:
    records = stream.read_many(start, end, 1 << 30)
    return [(r.offset, r.message.routing_key, r.message.body) for r in records]


def _read_in_frames(stream: LogStream, start: int, end: int, max_bytes: int) -> list[Row]:
    """A reader's loop: fetch, keep the records of its range, go on where the log says."""
    rows: list[Row] = []
    position = start
    while position < end:
        frames, next_offset = stream.read_frames(position, end, max_bytes)
        assert next_offset > position or not frames
        if frames:
            size = sum(len(head) + len(rest) for head, rest in frames)
            largest = max(len(head) + len(rest) for head, rest in frames)
            assert size < max_bytes + largest  # the budget, give or take the last frame
        got = []
        for head, rest in frames:
            frame = decode_frame(head + rest, 0)  # checks the length and the CRC
            assert frame is not None
            for record in frame.records:
                if position <= record.offset < end:
                    message = record.message
                    got.append((record.offset, message.routing_key, message.body))
        if frames:
            assert got, "frames that hold none of the records asked for"
        rows += got
        if next_offset <= position:
            break
        position = next_offset
    return rows


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(
        st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=120)), min_size=1, max_size=40),
        min_size=1,
        max_size=12,
    ),
    segment_bytes=st.sampled_from([600, 3000, 1 << 20]),
    data=st.data(),
)
def test_frames_hold_what_a_record_read_gives(
    tmp_path_factory: object,
    runs: list[list[tuple[str, bytes]]],
    segment_bytes: int,
    data: st.DataObject,
) -> None:
    root = tmp_path_factory.mktemp("frames")  # type: ignore[attr-defined]
    backend, stream = _open(root, segment_bytes)
    for run in runs:  # a run is sealed as one frame: a batch, or a record when it is alone
        stream.append_many([Message("ex", key, b"", body) for key, body in run])
        stream.seal()
        if data.draw(st.booleans()):
            flush(backend)
    flush(backend)
    total = stream.durable_end
    start = data.draw(st.integers(0, total + 2))
    end = data.draw(st.integers(start, total + 3))
    max_bytes = data.draw(st.integers(1, 4000))
    assert _read_in_frames(stream, start, end, max_bytes) == _expected(stream, start, end)
    backend.close()


def test_a_format_1_log_and_the_batches_after_it_are_read_in_frames(tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(FORMAT1, root)
    backend = LogBackend(segment_bytes=1 << 20, index_interval_bytes=256)
    backend.open(root)
    stream = backend.open_stream("/", "orders")
    assert isinstance(stream, LogStream)
    stream.append_many([Message("ex", "new", b"", b"new-%03d" % n) for n in range(40, 90)])
    flush(backend)
    for start in (0, 7, 39, 40, 41, 89):
        for max_bytes in (1, 500, 1 << 20):
            expected = _expected(stream, start, 90)
            assert _read_in_frames(stream, start, 90, max_bytes) == expected
    backend.close()


def test_compaction_gaps_are_stepped_over(tmp_path: Path) -> None:
    backend, stream = _open(tmp_path, segment_bytes=700)
    for n in range(200):
        stream.append(Message("", f"k{n % 5}", b"", b"v%03d" % n))
        if n % 10 == 9:
            stream.seal()
    flush(backend)
    policy = CompactionPolicy(key=lambda message: message.routing_key.encode())
    work = stream.compaction_work(policy, now_ms=0)
    assert work is not None
    assert stream.finish_compaction(work()) > 0
    flush(backend)
    kept = [offset for offset, _key, _body in _expected(stream, 0, 200)]
    assert len(kept) < 150  # gaps
    for start in (0, 3, 77, 150, 190):
        for max_bytes in (1, 300, 1 << 20):
            assert _read_in_frames(stream, start, 200, max_bytes) == _expected(stream, start, 200)
    backend.close()


def test_a_damaged_frame_fails_the_stream_with_one_clear_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Strict reads: a damaged frame below the durable end is never stepped over (a replica
    must not quietly serve less than it holds): the read raises ``CorruptLogError`` (an
    ``OSError``), the stream is failed with one error line naming its directory and segment,
    and every later read of any kind raises too."""
    backend, stream = _open(tmp_path, segment_bytes=8192)
    for n in range(300):
        stream.append(Message("", f"k{n % 7}", b"", b"body-%04d" % n + b"." * 40))
        if n % 10 == 9:
            stream.seal()  # batches of 10
    flush(backend)
    victim = next(
        p for p in sorted(stream.directory.glob("*.log")) if b"body-0150" in p.read_bytes()
    )
    raw = bytearray(victim.read_bytes())
    raw[raw.index(b"body-0150") + 2] ^= 1
    victim.write_bytes(bytes(raw))
    assert _read_in_frames(stream, 3, 140, 1 << 20) == _expected(stream, 3, 140)  # before it
    assert stream.failure is None
    # On the log's own logger: a fuzz target imported in this test process quiets its parent
    # (``tests/fuzz/log_targets.py``).
    with (
        caplog.at_level(logging.ERROR, logger="tqbroker.backends.log.reader"),
        pytest.raises(CorruptLogError) as raised,
    ):
        _read_in_frames(stream, 3, 300, 1 << 20)
    assert isinstance(raised.value, OSError)
    assert raised.value.errno == errno.EIO
    assert stream.failure is not None
    assert victim.name in stream.failure
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert str(stream.directory) in line
    assert victim.name in line
    assert "byte " in line
    for read in (
        lambda: stream.read_frames(0, 10, 1 << 20),
        lambda: stream.read(0),
        lambda: stream.read_from(0),
        lambda: stream.read_many(0, 10, 10),
        lambda: stream.offset_for_timestamp(0),
    ):
        with pytest.raises(CorruptLogError):
            read()
    backend.close()
    backend, stream = _open(tmp_path, segment_bytes=8192)  # a restart: found again on a read
    with pytest.raises(CorruptLogError):
        _read_in_frames(stream, 140, 300, 1 << 20)
    backend.close()


def _damage_frame(root: Path, index: int, *, length_field: bool) -> None:
    """Damage the ``index``-th frame of the stream's only segment: its length field or a
    byte of its body (its CRC fails)."""
    (path,) = sorted(root.rglob("*.log"))
    raw = bytearray(path.read_bytes())
    pos, starts = 0, []
    while pos < len(raw):
        starts.append(pos)
        pos += 4 + struct.unpack_from(">I", raw, pos)[0]
    victim = starts[index]
    if length_field:
        struct.pack_into(">I", raw, victim, struct.unpack_from(">I", raw, victim)[0] + 1)
    else:
        raw[victim + 40] ^= 1
    path.write_bytes(bytes(raw))


def _batches_of(root: Path, size: int, count: int) -> None:
    backend, stream = _open(root, index_interval_bytes=4096)
    for first in range(0, count, size):
        stream.append_many(
            [Message("", "k", b"", b"b%04d" % n) for n in range(first, first + size)]
        )
        stream.seal()
    flush(backend)
    backend.close()  # a clean stop: the next open trusts the files


@pytest.mark.parametrize("length_field", [True, False], ids=["length", "body"])
def test_damage_on_the_way_to_a_range_fails_the_read(tmp_path: Path, length_field: bool) -> None:
    """A read whose range reaches the damaged frame fails (recovery indexed the frame after
    it, so a range from there on still reads until the stream is failed); a range before it
    reads."""
    _batches_of(tmp_path, 3, 30)
    _damage_frame(tmp_path, 2, length_field=length_field)  # the batch of 6..8
    backend, stream = _open(tmp_path, index_interval_bytes=4096)
    assert _read_in_frames(stream, 0, 3, 1 << 20) == [(o, "k", b"b%04d" % o) for o in range(3)]
    assert _read_in_frames(stream, 12, 30, 1 << 20) == _expected(stream, 12, 30)
    with pytest.raises(CorruptLogError):
        _read_in_frames(stream, 4, 30, 1 << 20)
    assert stream.failure is not None
    backend.close()
