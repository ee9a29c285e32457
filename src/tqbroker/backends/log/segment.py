"""One log segment: a ``.log`` file of records plus its sparse ``.index`` and ``.timeindex``.

Responsibilities:
- files named by the segment's 20-digit base offset, as Kafka names them;
- buffered appends (``append`` adds to a buffer, ``write_out`` writes it with one ``pwrite``);
- the sparse offset index (one entry per ``index_interval_bytes`` of records) and the monotonic
  time index, kept in memory as arrays and appended to their files;
- reads by offset: index lookup, then a forward scan;
- recovery: ``scan`` validates every record, truncates the torn tail at the first bad length or
  CRC and rebuilds both indexes.

The segment never fsyncs by itself; ``sync`` (run by the flusher's worker thread) does. File
descriptors stay open for the segment's life so that reads never race a close.
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_right
from pathlib import Path

from .format import (
    HEAD_SIZE,
    INDEX_ENTRY,
    RECORD_HEAD,
    TIME_ENTRY,
    Record,
    RecordError,
    decode_record,
)

log = logging.getLogger("tqbroker.backends.log")

READ_AHEAD = 64 * 1024


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class Segment:
    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = directory / segment_name(base_offset, ".log")
        self.index_path = directory / segment_name(base_offset, ".index")
        self.time_path = directory / segment_name(base_offset, ".timeindex")
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._time_fd = os.open(self.time_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = 0  # bytes of records in the file plus the buffer
        self.written = 0  # bytes of records already in the file
        self.next_offset = base_offset
        self.max_timestamp = -1
        self._buffer = bytearray()
        self._index_offsets = array("I")  # relative offsets
        self._index_positions = array("I")
        self._index_buffer = bytearray()
        self._index_written = 0
        self._time_stamps = array("Q")
        self._time_offsets = array("I")
        self._time_buffer = bytearray()
        self._time_written = 0
        self._since_index = 0
        self.dirty = False  # written since the last sync
        self._read_pos = -1  # read-ahead cache: file position of _read_buf
        self._read_buf = b""

    # -- appending ---------------------------------------------------------------------------

    def append(self, offset: int, timestamp_ms: int, record: bytes) -> None:
        relative = offset - self.base_offset
        if self._since_index >= self.index_interval_bytes or not self._index_offsets:
            self._add_index_entry(relative, self.size, timestamp_ms)
        self._buffer += record
        self.size += len(record)
        self._since_index += len(record)
        self.next_offset = offset + 1
        self.max_timestamp = max(self.max_timestamp, timestamp_ms)

    def _add_index_entry(self, relative: int, position: int, timestamp_ms: int) -> None:
        self._index_offsets.append(relative)
        self._index_positions.append(position)
        self._index_buffer += INDEX_ENTRY.pack(relative, position)
        if not self._time_stamps or timestamp_ms > self._time_stamps[-1]:
            self._time_stamps.append(timestamp_ms)
            self._time_offsets.append(relative)
            self._time_buffer += TIME_ENTRY.pack(timestamp_ms, relative)
        self._since_index = 0

    @property
    def pending(self) -> int:
        """Bytes appended but not yet written to the file."""
        return len(self._buffer)

    def write_out(self) -> None:
        """Write buffered records and index entries to the files (page cache, no fsync).
        Raises OSError (e.g. ENOSPC); the buffer is kept so a later call can retry."""
        if self._buffer:
            data = bytes(self._buffer)
            written = 0
            try:
                while written < len(data):
                    written += os.pwrite(self._fd, data[written:], self.written + written)
            except OSError:
                # Leave the file as it was before this call: a retry rewrites everything.
                os.ftruncate(self._fd, self.written)
                raise
            self.written += len(data)
            self._buffer.clear()
            self.dirty = True
        if self._index_buffer:
            self._index_written += os.pwrite(
                self._index_fd, bytes(self._index_buffer), self._index_written
            )
            self._index_buffer.clear()
            self.dirty = True
        if self._time_buffer:
            self._time_written += os.pwrite(
                self._time_fd, bytes(self._time_buffer), self._time_written
            )
            self._time_buffer.clear()
            self.dirty = True

    def sync(self) -> None:
        """fdatasync the record file and both indexes (worker thread)."""
        os.fdatasync(self._fd)
        os.fdatasync(self._index_fd)
        os.fdatasync(self._time_fd)

    # -- reading -----------------------------------------------------------------------------

    def _position_for(self, offset: int) -> int:
        """File position of the last index entry at or before ``offset``."""
        i = bisect_right(self._index_offsets, offset - self.base_offset) - 1
        return self._index_positions[i] if i >= 0 else 0

    def read(self, offset: int) -> Record | None:
        """The record with ``offset``, or None if the segment does not hold it."""
        if not self.base_offset <= offset < self.next_offset:
            return None
        if self._buffer:
            self.write_out()
        pos = self._position_for(offset)
        while pos < self.written:
            record = self._read_at(pos)
            if record.offset == offset:
                return record
            if record.offset > offset:
                return None
            pos += record.size
        return None

    def _read_at(self, pos: int) -> Record:
        buf_start = self._read_pos
        if buf_start <= pos and pos + HEAD_SIZE <= buf_start + len(self._read_buf):
            (length, _crc) = RECORD_HEAD.unpack_from(self._read_buf, pos - buf_start)
            if pos + 4 + length <= buf_start + len(self._read_buf):
                record = decode_record(self._read_buf, pos - buf_start)
                if record is not None:
                    return record
        # Refill: at least the whole record (its length is in the first 4 bytes).
        head = os.pread(self._fd, READ_AHEAD, pos)
        if len(head) >= 4:
            length = int.from_bytes(head[:4], "big")
            if 4 + length > len(head) and pos + 4 + length <= self.written:
                head += os.pread(self._fd, 4 + length - len(head), pos + len(head))
        self._read_pos, self._read_buf = pos, head
        record = decode_record(head, 0)
        if record is None:
            raise RecordError(f"record at {self.log_path}:{pos} is cut short")
        return record

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose record has a timestamp >= ``timestamp_ms`` (None: none here)."""
        if self.max_timestamp < timestamp_ms:
            return None
        i = bisect_right(self._time_stamps, timestamp_ms - 1) - 1
        pos = self._position_for(self.base_offset + self._time_offsets[i]) if i >= 0 else 0
        while pos < self.written:
            record = self._read_at(pos)
            if record.timestamp_ms >= timestamp_ms:
                return record.offset
            pos += record.size
        return None

    # -- recovery ----------------------------------------------------------------------------

    def load(self) -> None:
        """Trust the files (clean shutdown): size from the file, indexes from their files;
        rebuild the indexes if they look wrong."""
        self.size = self.written = os.fstat(self._fd).st_size
        if not self._load_indexes() or not self._tail_consistent():
            self.scan(truncate=False)

    def _load_indexes(self) -> bool:
        raw = os.pread(self._index_fd, os.fstat(self._index_fd).st_size, 0)
        times = os.pread(self._time_fd, os.fstat(self._time_fd).st_size, 0)
        if len(raw) % INDEX_ENTRY.size or len(times) % TIME_ENTRY.size:
            return False
        offsets, positions = array("I"), array("I")
        for relative, position in INDEX_ENTRY.iter_unpack(raw):
            if position >= self.size or (offsets and relative <= offsets[-1]):
                return False
            offsets.append(relative)
            positions.append(position)
        stamps, time_offsets = array("Q"), array("I")
        for stamp, relative in TIME_ENTRY.iter_unpack(times):
            if stamps and stamp <= stamps[-1]:
                return False
            stamps.append(stamp)
            time_offsets.append(relative)
        self._index_offsets, self._index_positions = offsets, positions
        self._time_stamps, self._time_offsets = stamps, time_offsets
        self._index_written, self._time_written = len(raw), len(times)
        return True

    def _tail_consistent(self) -> bool:
        """Walk from the last index entry to the end: every record valid, ending exactly at
        the file size. Sets next_offset and max_timestamp."""
        if self.size == 0:
            return not self._index_offsets
        if not self._index_offsets:
            return False
        pos = self._index_positions[-1]
        expected = self.base_offset + self._index_offsets[-1]
        try:
            while pos < self.size:
                record = self._read_at(pos)
                if record.offset != expected:
                    return False
                self.max_timestamp = max(self.max_timestamp, record.timestamp_ms)
                expected += 1
                pos += record.size
        except RecordError:
            return False
        self.next_offset = expected
        self._since_index = self.size - self._index_positions[-1]
        if self._time_stamps:
            self.max_timestamp = max(self.max_timestamp, self._time_stamps[-1])
        return pos == self.size

    def scan(self, *, truncate: bool = True) -> bool:
        """Validate every record from the start, rebuild both indexes and (``truncate``) cut
        the file at the first invalid record. Returns False if anything was cut."""
        file_size = os.fstat(self._fd).st_size
        self.size = self.written = file_size
        self._reset_indexes()
        pos, expected = 0, self.base_offset
        intact = True
        while pos < file_size:
            try:
                record = self._read_at(pos)
            except RecordError as exc:
                log.warning("%s: invalid record at byte %d (%s)", self.log_path, pos, exc)
                intact = False
                break
            if record.offset != expected:
                log.warning(
                    "%s: record at byte %d has offset %d, expected %d",
                    self.log_path,
                    pos,
                    record.offset,
                    expected,
                )
                intact = False
                break
            if self._since_index >= self.index_interval_bytes or not self._index_offsets:
                self._add_index_entry(expected - self.base_offset, pos, record.timestamp_ms)
            self._since_index += record.size
            self.max_timestamp = max(self.max_timestamp, record.timestamp_ms)
            pos += record.size
            expected += 1
        self.next_offset = expected
        if not intact and truncate:
            log.warning("%s: truncating the torn tail at byte %d", self.log_path, pos)
            os.ftruncate(self._fd, pos)
        self.size = self.written = pos
        self._read_pos, self._read_buf = -1, b""
        # Rewrite both index files from what the scan found.
        os.ftruncate(self._index_fd, 0)
        os.ftruncate(self._time_fd, 0)
        self._index_written = self._time_written = 0
        self.write_out()
        return intact

    def _reset_indexes(self) -> None:
        self._index_offsets, self._index_positions = array("I"), array("I")
        self._time_stamps, self._time_offsets = array("Q"), array("I")
        self._index_buffer.clear()
        self._time_buffer.clear()
        self._since_index = 0
        self.max_timestamp = -1

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        for fd in (self._fd, self._index_fd, self._time_fd):
            os.close(fd)

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path, self.time_path):
            path.unlink(missing_ok=True)
