"""One log segment: a ``.log`` file of records plus its sparse ``.index`` and ``.timeindex``.

Responsibilities:
- files named by the segment's 20-digit base offset, as Kafka names them;
- records with strictly increasing offsets: consecutive as appended, with gaps once compacted;
- buffered appends (``append`` adds to a buffer, ``write_out`` writes it with one ``pwrite``);
- the sparse offset index (one entry per ``index_interval_bytes`` of records) and the time index
  (the greatest timestamp so far at those entries, so monotonic whatever the record timestamps),
  kept in memory as arrays and appended to their files;
- reads by offset: index lookup, then a forward scan (records not yet written out are read from
  the buffer); a damaged record (a flipped bit) is stepped over, so only that one is lost; and
  every intact record from an offset on, in order;
- recovery: ``scan`` validates every record, truncates the torn tail at the first bad length or
  CRC and rebuilds both indexes; ``load`` trusts the files of a clean shutdown but checks every
  index entry against the record header it points at;
- compaction's side: ``read_file_records`` reads a snapshot of a record file in a worker thread;
  ``install`` moves a compacted copy, written as a segment of its own elsewhere, over the files
  of the segment it replaces.

The segment never fsyncs by itself; ``sync`` (run by the flusher's worker thread) does, the
record file alone while the segment is active, the indexes too once it is sealed. File
descriptors stay open for the segment's life so that reads never race a close.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
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
RECORD_START = struct.Struct(">IIQQ")  # length, crc, offset, timestamp_ms
# Past a damaged record, how many offsets ahead the search for the next intact one looks.
RESYNC_RECORDS = 16


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
        self.dirty = False  # records written since the last sync
        self.index_dirty = False  # index entries written since the last sync of the indexes
        self._read_pos = -1  # read-ahead cache: file position of _read_buf
        self._read_buf = b""
        # Where the last walk stopped: (least offset, file position) of the next record.
        self._hint = (-1, 0)

    # -- appending ---------------------------------------------------------------------------

    def append(self, offset: int, timestamp_ms: int, record: bytes) -> None:
        self.max_timestamp = max(self.max_timestamp, timestamp_ms)
        if self._since_index >= self.index_interval_bytes or not self._index_offsets:
            self._add_index_entry(offset - self.base_offset, self.size)
        self._buffer += record
        self.size += len(record)
        self._since_index += len(record)
        self.next_offset = offset + 1

    def _add_index_entry(self, relative: int, position: int) -> None:
        """Index the record at ``position`` (``max_timestamp`` already counts it). The time
        index gets the greatest timestamp so far, as Kafka's does, and only when it grew: it
        stays strictly increasing even when record timestamps are not, and every record before
        an entry's offset has a timestamp at or below the entry's."""
        self._index_offsets.append(relative)
        self._index_positions.append(position)
        self._index_buffer += INDEX_ENTRY.pack(relative, position)
        if not self._time_stamps or self.max_timestamp > self._time_stamps[-1]:
            self._time_stamps.append(self.max_timestamp)
            self._time_offsets.append(relative)
            self._time_buffer += TIME_ENTRY.pack(self.max_timestamp, relative)
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
            self.index_dirty = True
        if self._time_buffer:
            self._time_written += os.pwrite(
                self._time_fd, bytes(self._time_buffer), self._time_written
            )
            self._time_buffer.clear()
            self.index_dirty = True

    def sync(self, *, indexes: bool = True) -> None:
        """fdatasync the record file and (with ``indexes``) both indexes (worker thread). The
        active segment's group commits sync the record file alone: recovery rebuilds the
        indexes of every segment it rescans, and a segment is synced with its indexes once it
        is sealed, before a recovery point can pass it."""
        os.fdatasync(self._fd)
        if indexes:
            os.fdatasync(self._index_fd)
            os.fdatasync(self._time_fd)

    # -- reading -----------------------------------------------------------------------------

    def _entry(self, i: int) -> tuple[int, int]:
        """File position and offset of index entry ``i`` (-1: the start of the segment)."""
        if i < 0:
            return 0, self.base_offset
        return self._index_positions[i], self.base_offset + self._index_offsets[i]

    def read(self, offset: int) -> Record | None:
        """The record with ``offset``, or None if the segment does not hold it. Raises
        ``RecordError`` if that record is damaged; damaged records before it are stepped over."""
        if not self.base_offset <= offset < self.next_offset:
            return None
        damaged: list[RecordError] = []
        record = self.read_from(offset, damaged.append)
        if record is not None and record.offset == offset:
            return record
        if damaged:
            raise damaged[0]
        return None

    def read_next(self, offset: int) -> Record | None:
        """``read_from`` for a sequential reader, cheaply: the intact record where the last read
        stopped if ``offset`` is where it stopped; None otherwise (or if that record is damaged:
        ``read_from`` then finds it again and reports it)."""
        hint_least, pos = self._hint
        if offset != hint_least or pos >= self.size:
            return None
        try:
            record = self._read_at(pos)
        except RecordError:
            return None
        if record.offset < offset:
            return None
        self._hint = (record.offset + 1, pos + record.size)
        return record

    def read_from(self, offset: int, on_damage: Callable[[RecordError], None]) -> Record | None:
        """The first intact record at or after ``offset`` (None: none in this segment). A
        damaged record met on the way, after every record below ``offset``, goes to
        ``on_damage`` and is stepped over."""
        record = self.read_next(offset)
        if record is not None:
            return record
        damage: RecordError | None = None
        for item in self._walk_from(offset):
            if isinstance(item, RecordError):
                damage = item
            elif item.offset < offset:
                damage = None
            else:
                if damage is not None:
                    on_damage(damage)
                return item
        if damage is not None:
            on_damage(damage)
        return None

    def records(self, offset: int) -> Iterator[Record]:
        """The intact records from ``offset`` to the end, in order; damaged ones are stepped
        over silently (``read`` is what reports them)."""
        for item in self._walk_from(offset):
            if isinstance(item, Record) and item.offset >= offset:
                yield item

    def _walk_from(self, offset: int) -> Iterator[Record | RecordError]:
        """``_walk`` from the last index entry at or before ``offset``, or from where the last
        walk stopped if that is closer (sequential reads then decode each record once)."""
        i = bisect_right(self._index_offsets, offset - self.base_offset) - 1
        pos, least = self._entry(i)
        hint_least, hint_pos = self._hint
        if least <= hint_least <= offset:
            pos, least = hint_pos, hint_least
        return self._walk(pos, least)

    def _walk(self, pos: int, least: int) -> Iterator[Record | RecordError]:
        """The records from byte ``pos`` (where a record with offset ``least`` or more starts)
        to the end, the append buffer included. A damaged record (or one whose offset is not
        above the one before) yields a ``RecordError`` instead, and the walk goes on at the next
        intact record (see ``_resync``)."""
        while pos < self.size:
            try:
                record = self._read_at(pos)
                if record.offset < least:
                    raise RecordError(f"offset {record.offset} where {least} or more belongs")
            except RecordError as exc:
                yield RecordError(f"byte {pos}: {exc}")
                resume = self._resync(pos, least)
                if resume is None:
                    return
                pos, least = resume
                continue
            pos += record.size
            least = record.offset + 1
            self._hint = (least, pos)
            yield record

    def _resync(self, pos: int, least: int) -> tuple[int, int] | None:
        """After a damaged record at byte ``pos`` (whose offset is ``least`` or more): the
        position and offset of the next intact record. That is where the damaged record's
        length says, unless the length field is what was damaged: then the next records are
        searched for by their offset field (a match counts only with a valid CRC), the next
        ``RESYNC_RECORDS`` offsets up to the next index entry, a known record start (so in a
        compacted segment, whose offsets have gaps, the records up to that entry may be lost);
        None if the file ends first."""
        if pos >= self.written:
            return None  # the append buffer is never damaged
        j = bisect_right(self._index_positions, pos)
        limit, limit_offset = (
            self._entry(j) if j < len(self._index_positions) else (self.written, None)
        )
        end = min(limit, self.written)
        head = os.pread(self._fd, 4, pos)
        if len(head) == 4:
            candidate = pos + 4 + int.from_bytes(head, "big")
            found = self._intact_at(candidate, least + 1) if candidate < end else None
            if found is not None:
                return candidate, found
        last = least + 1 + RESYNC_RECORDS
        if limit_offset is not None:
            last = min(last, limit_offset)
        with mmap.mmap(self._fd, end, access=mmap.ACCESS_READ) as view:
            for offset in range(least + 1, last):
                needle = offset.to_bytes(8, "big")
                at = view.find(needle, pos + 1 + HEAD_SIZE, end)
                while at >= 0:
                    if self._intact_at(at - HEAD_SIZE, offset) is not None:
                        return at - HEAD_SIZE, offset
                    at = view.find(needle, at + 1, end)
        if limit_offset is not None:
            return limit, limit_offset
        return None

    def _intact_at(self, pos: int, least: int) -> int | None:
        """The offset of the intact record at byte ``pos`` if it is ``least`` or more."""
        try:
            offset = self._read_at(pos).offset
        except RecordError:
            return None
        return offset if offset >= least else None

    def _read_at(self, pos: int) -> Record:
        if pos >= self.written:
            # Not written out yet (perhaps because writing fails: a full disk): read it from
            # the append buffer rather than write it out, which could raise OSError.
            record = decode_record(self._buffer, pos - self.written)
            if record is None:
                raise RecordError(f"record at {self.log_path}:{pos} is cut short")
            return record
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
        """The first offset whose record has a timestamp >= ``timestamp_ms`` (None: none here).
        Damaged records are stepped over."""
        if self.max_timestamp < timestamp_ms:
            return None
        i = bisect_right(self._time_stamps, timestamp_ms - 1) - 1
        j = bisect_right(self._index_offsets, self._time_offsets[i]) - 1 if i >= 0 else -1
        for item in self._walk(*self._entry(j)):
            if isinstance(item, Record) and item.timestamp_ms >= timestamp_ms:
                return item.offset
        return None

    # -- recovery ----------------------------------------------------------------------------

    def load(self, end_offset: int | None = None) -> None:
        """Trust the files (clean shutdown): size from the file, indexes from their files;
        rebuild the indexes if they look wrong. ``end_offset``: the segment is sealed and
        holds the offsets below it (the next segment's base)."""
        self.size = self.written = os.fstat(self._fd).st_size
        if not self._load_indexes() or not self._indexes_agree() or not self._tail_consistent():
            self.scan(truncate=False, end_offset=end_offset)

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

    def _indexes_agree(self) -> bool:
        """Every offset-index entry points at the header of the record it names; every
        time-index entry goes with an offset-index entry (they are written together, the first
        record always getting both) and holds at least that record's timestamp (the greatest
        timestamp so far)."""
        if not self._index_offsets or not self._time_stamps:
            return not self._index_offsets and not self._time_stamps
        base = self.base_offset
        positions = dict(zip(self._index_offsets, self._index_positions, strict=True))
        with mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ) as view:
            for relative, position in positions.items():
                if position + RECORD_START.size > self.size:
                    return False
                _length, _crc, offset, _stamp = RECORD_START.unpack_from(view, position)
                if offset != base + relative:
                    return False
            for stamp, relative in zip(self._time_stamps, self._time_offsets, strict=True):
                at = positions.get(relative)
                if at is None or RECORD_START.unpack_from(view, at)[3] > stamp:
                    return False
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
                if record.offset < expected:
                    return False
                self.max_timestamp = max(self.max_timestamp, record.timestamp_ms)
                expected = record.offset + 1
                pos += record.size
        except RecordError:
            return False
        self.next_offset = expected
        self._since_index = self.size - self._index_positions[-1]
        if self._time_stamps:
            self.max_timestamp = max(self.max_timestamp, self._time_stamps[-1])
        return pos == self.size

    def scan(self, *, truncate: bool = True, end_offset: int | None = None) -> bool:
        """Validate every record from the start and rebuild both indexes. At the first invalid
        record, ``truncate`` cuts the file there (a torn tail); otherwise (rebuilding the
        indexes of a trusted file) the scan steps over it and goes on. Returns False if any
        record was invalid. ``end_offset`` as for ``load``."""
        file_size = os.fstat(self._fd).st_size
        self.size = self.written = file_size
        self._reset_indexes()
        pos, expected = 0, self.base_offset
        intact = True
        while pos < file_size:
            try:
                record = self._read_at(pos)
                if record.offset < expected:
                    raise RecordError(f"offset {record.offset}, expected {expected} or more")
            except RecordError as exc:
                log.warning("%s: invalid record at byte %d (%s)", self.log_path, pos, exc)
                intact = False
                resume = None if truncate else self._resync(pos, expected)
                if resume is None:
                    break
                log.warning(
                    "%s: stepping over it: offset %d follows at byte %d",
                    self.log_path,
                    resume[1],
                    resume[0],
                )
                pos, expected = resume
                self._since_index = self.index_interval_bytes  # index the record after it
                continue
            self.max_timestamp = max(self.max_timestamp, record.timestamp_ms)
            if self._since_index >= self.index_interval_bytes or not self._index_offsets:
                self._add_index_entry(record.offset - self.base_offset, pos)
            self._since_index += record.size
            pos += record.size
            expected = record.offset + 1
        self.next_offset = expected
        if not intact and truncate:
            log.warning("%s: truncating the torn tail at byte %d", self.log_path, pos)
            os.ftruncate(self._fd, pos)
        elif pos < file_size and end_offset is not None:
            # A sealed segment ends with damaged records: keep them (reads report them).
            pos, self.next_offset = file_size, max(expected, end_offset)
        self.size = self.written = pos
        self._read_pos, self._read_buf = -1, b""
        self._hint = (-1, 0)
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
        self.unlink()

    def unlink(self) -> None:
        """Remove the files (the record file first: index files without one are orphans, which
        a start removes); the descriptors stay open until ``close``."""
        for path in (self.log_path, self.index_path, self.time_path):
            path.unlink(missing_ok=True)

    def install(self, directory: Path) -> None:
        """Move the files of this segment (a compacted copy, written and synced in another
        directory of the same file system) into ``directory``, over those of the segment with
        the same base offset. The replaced index files go first, then the record file is
        renamed over the old one (atomic), then the new indexes follow: a crash at any point
        leaves the old or the new record file, with its own indexes or none (rebuilt at the next
        start). Making the renames durable (``fsync_dir``) is the caller's business."""
        paths = [
            directory / segment_name(self.base_offset, suffix)
            for suffix in (".log", ".index", ".timeindex")
        ]
        for path in paths[1:]:
            path.unlink(missing_ok=True)
        for source, target in zip(
            (self.log_path, self.index_path, self.time_path), paths, strict=True
        ):
            os.replace(source, target)
        self.directory = directory
        self.log_path, self.index_path, self.time_path = paths


def read_file_records(path: Path, size: int) -> Iterator[tuple[Record, bytes]]:
    """The records in the first ``size`` bytes of the record file at ``path``, each with its
    bytes, in order: a snapshot read by a worker thread through a descriptor of its own (the
    file may be appended to meanwhile, or unlinked). Raises ``RecordError`` at the first
    damaged record (or one whose offset is not above the one before), OSError if the file is
    gone."""
    if size == 0:
        return
    with (
        open(path, "rb") as file,
        mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as mapped,
        memoryview(mapped) as view,
    ):
        pos, least = 0, 0
        while pos < size:
            record = decode_record(view, pos)
            if record is None:
                raise RecordError(f"record at {path}:{pos} is cut short")
            if record.offset < least:
                raise RecordError(f"offset {record.offset} at {path}:{pos}, {least} or more due")
            yield record, bytes(view[pos : pos + record.size])
            pos += record.size
            least = record.offset + 1
