"""Fuzz target of the log backend's recovery: segment-file bytes (and index files) as a crash or
a bad disk could leave them, loaded and scanned as a start does, then read back.

Documented errors: none escape ``load_segment``/``scan_segment`` (a bad record is logged and
stepped over or truncated); reads raise ``RecordError`` for a damaged record only.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tqbroker.backends.log import segment_reads
from tqbroker.backends.log.compaction import read_file_records
from tqbroker.backends.log.format import RecordError, decode_frame, encode_record
from tqbroker.backends.log.recovery import load_segment, scan_segment
from tqbroker.backends.log.segment import Segment, segment_name
from tqbroker.model import Message
from tqbroker.storage_env import StorageEnv
from tqbroker.storage_env.filecache import Directory

from .common import Reader, target

# Recovery warns about every bad record: the fuzzer makes millions.
logging.getLogger("tqbroker.backends.log").setLevel(logging.CRITICAL)

_DIRECTORY: Path | None = None


def directory() -> Path:
    """A directory of this process for the segment files (in memory when /dev/shm exists)."""
    global _DIRECTORY
    if _DIRECTORY is None and os.environ.get("TQBROKER_FUZZ_TMP"):  # the runner's, removed by it
        _DIRECTORY = Path(os.environ["TQBROKER_FUZZ_TMP"])
    if _DIRECTORY is None:
        parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
        _DIRECTORY = Path(tempfile.mkdtemp(prefix="tqbroker-fuzz-", dir=parent))
        atexit.register(shutil.rmtree, _DIRECTORY, ignore_errors=True)
    return _DIRECTORY


def intact_prefix(raw: bytes, base: int) -> list[tuple[int, int, bytes]]:
    """The records a scan must keep: ``(position, offset, body)`` of each valid record from the
    start, offsets increasing from ``base``, up to the first that is not."""
    found: list[tuple[int, int, bytes]] = []
    pos, least = 0, base
    while pos < len(raw):
        try:
            frame = decode_frame(raw, pos)
        except RecordError:
            break
        if frame is None or frame.offset < least:
            break
        found.extend((pos, record.offset, record.message.body) for record in frame.records)
        pos += frame.size
        least = frame.last_offset + 1
    return found


@target("log", max_len=16384)
def fuzz_log(data: bytes) -> None:
    """Log segment recovery: load or scan any bytes without an exception, keep every intact
    record before the first damaged one, and read back only intact records."""
    reader = Reader(data)
    mode = reader.byte()
    interval = (reader.byte() % 8 + 1) * 64
    base = reader.byte() * 1000
    index_raw, time_raw, log_raw = reader.parts(3)
    where = directory()
    paths = [where / segment_name(base, suffix) for suffix in (".log", ".index", ".timeindex")]
    for path, raw in zip(paths, (log_raw, index_raw, time_raw), strict=True):
        path.write_bytes(raw)
    segment = Segment(StorageEnv.default().files, Directory(where), base, interval)
    try:
        end_offset = base + mode // 8 if mode & 4 else None
        truncate = bool(mode & 2)
        if mode & 1:
            load_segment(segment, end_offset)
        else:
            scan_segment(segment, truncate=truncate, end_offset=end_offset)
        _check(segment, log_raw, base, rescanned=not mode & 1, active=end_offset is None)
        if not mode & 1 and truncate:
            # What a truncating scan leaves is a valid segment: a second scan keeps it all.
            before = [(r.offset, r.message.body) for r in segment_reads.records(segment, base)]
            assert scan_segment(segment, truncate=True), "a scanned segment is not intact"
            assert [
                (r.offset, r.message.body) for r in segment_reads.records(segment, base)
            ] == before
            assert segment.size == os.path.getsize(paths[0])
            listed = [r.offset for r, _ in read_file_records(paths[0], segment.size)]
            assert listed == [offset for offset, _ in before]
    finally:
        segment.delete()


def _check(segment: Segment, raw: bytes, base: int, *, rescanned: bool, active: bool) -> None:
    records = list(segment_reads.records(segment, base))
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)), f"offsets not increasing: {offsets}"
    assert all(base <= o < segment.next_offset for o in offsets), (offsets, segment.next_offset)
    kept = {r.offset: r.message.body for r in records}
    for _pos, offset, body in intact_prefix(raw, base):
        assert kept.get(offset) == body, f"intact record {offset} lost"
    if rescanned:  # indexes rebuilt from the records (loaded ones may be garbage)
        for record in records:
            found = segment_reads.read(segment, record.offset)
            assert found is not None
            assert found.message.body == record.message.body
    for offset in range(base, min(segment.next_offset, base + 64)):
        with contextlib.suppress(RecordError):
            segment_reads.read(segment, offset)
    if not active:
        return  # a sealed segment (another follows it) is never appended to
    # The log goes on from there: a record appended now reads back, after every other one.
    offset = segment.next_offset
    message = Message("", "appended", b"\x00\x00", b"after recovery")
    segment.append(offset, 1, encode_record(offset, 1, 0, message))
    segment.write_out()
    found = segment_reads.read(segment, offset)
    assert found is not None, "a record appended after recovery cannot be read"
    assert found.message.body == b"after recovery"
    assert [r.offset for r in segment_reads.records(segment, base)][-1] == offset
