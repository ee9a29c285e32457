"""Frame reads (``StreamLog.read_frames``, ``backends/log/frames.py``): the frames a bulk reader
gets as they lie on disk hold exactly the records a record-by-record read gives, in order and
once each, whatever the range, the byte budget, the mix of batches and single records (format 1
logs, compacted segments), the segments' boundaries and the gaps between offsets; a damaged
frame is stepped over and reported as every read reports it."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.format import decode_frame
from tqbroker.backends.log.stream import LogStream
from tqbroker.backends.streams import CompactionPolicy
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


def _flush(backend: LogBackend) -> None:
    work = backend.begin_flush()
    if work is not None:
        work()


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
            _flush(backend)
    _flush(backend)
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
    _flush(backend)
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
    _flush(backend)
    policy = CompactionPolicy(key=lambda message: message.routing_key.encode())
    work = stream.compaction_work(policy, now_ms=0)
    assert work is not None
    assert stream.finish_compaction(work()) > 0
    _flush(backend)
    kept = [offset for offset, _key, _body in _expected(stream, 0, 200)]
    assert len(kept) < 150  # gaps
    for start in (0, 3, 77, 150, 190):
        for max_bytes in (1, 300, 1 << 20):
            assert _read_in_frames(stream, start, 200, max_bytes) == _expected(stream, start, 200)
    backend.close()


def test_a_damaged_frame_is_stepped_over_and_reported(tmp_path: Path) -> None:
    backend, stream = _open(tmp_path, segment_bytes=8192)
    for n in range(300):
        stream.append(Message("", f"k{n % 7}", b"", b"body-%04d" % n + b"." * 40))
        if n % 10 == 9:
            stream.seal()  # batches of 10
    _flush(backend)
    victim = next(
        p for p in sorted(stream.directory.glob("*.log")) if b"body-0150" in p.read_bytes()
    )
    raw = bytearray(victim.read_bytes())
    raw[raw.index(b"body-0150") + 2] ^= 1
    victim.write_bytes(bytes(raw))
    rows = _read_in_frames(stream, 3, 300, 1 << 20)
    assert [offset for offset, _key, _body in rows] == [
        o for o in range(3, 300) if not 150 <= o < 160
    ]  # the batch of 150 is lost whole, and only it
    assert stream.log.corrupt_records == 1
    backend.close()


def _damage_frame(root: Path, index: int, *, length_field: bool) -> None:
    """Damage the ``index``-th frame of the stream's only segment: its length field (the read
    must find the next frame by searching) or a byte of its body (its CRC fails)."""
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
    _flush(backend)
    backend.close()  # a clean stop: the next open trusts the files


def test_a_damaged_length_after_a_small_batch_loses_only_its_frame(tmp_path: Path) -> None:
    """Batches of 10 small records share an index entry: after a damaged length field the
    search for the next frame starts past the last batch's last offset, not its first."""
    _batches_of(tmp_path, 10, 200)
    _damage_frame(tmp_path, 3, length_field=True)  # the batch of 30..39
    backend, stream = _open(tmp_path, index_interval_bytes=4096)
    rows = _read_in_frames(stream, 0, 200, 1 << 20)
    assert rows == _expected(stream, 0, 200)
    assert [offset for offset, _key, _body in rows] == [o for o in range(200) if not 30 <= o < 40]
    backend.close()


def test_damage_is_reported_once_and_only_within_the_range(tmp_path: Path) -> None:
    """A frame that holds the offset asked for but is damaged: the batch before it (taken
    because it might hold the offset) is not sent; the damage is reported by the read whose
    range it falls in, once, and not by reads beside it."""
    _batches_of(tmp_path, 3, 30)
    _damage_frame(tmp_path, 1, length_field=False)  # the batch of 3..5
    backend, stream = _open(tmp_path, index_interval_bytes=4096)
    frames, next_offset = stream.read_frames(4, 6, 1 << 20)
    assert (frames, next_offset) == ([], 6)
    assert stream.log.corrupt_records == 1
    stream.read_frames(6, 30, 1 << 20)  # past it: not reported again
    stream.read_frames(0, 3, 1 << 20)  # before it: not reported
    assert stream.log.corrupt_records == 1
    for start in range(0, 30):  # a reader's loop with a small budget, from anywhere
        reported = stream.log.corrupt_records
        assert _read_in_frames(stream, start, 30, 40) == _expected(stream, start, 30)
        # once by each loop whose range holds the damaged records (and by _expected's reads)
        assert stream.log.corrupt_records - reported == (2 if start <= 5 else 0), start
    backend.close()
