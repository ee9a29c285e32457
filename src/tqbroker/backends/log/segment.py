"""One log segment: a ``.log`` file of records plus its sparse ``.index`` and ``.timeindex``.

Responsibilities:
- files named by the segment's 20-digit base offset, as Kafka names them;
- frames (``format.py``: single records, or record batches) with strictly increasing offsets:
  consecutive as appended, with gaps once compacted;
- buffered appends (``append`` adds a frame to a buffer, ``write_out`` writes it with one
  ``pwrite``);
- its two ``SparseIndex``es (``index.py``): the offset index (one entry per
  ``index_interval_bytes`` of records) and the time index (the greatest timestamp so far at those
  entries, so monotonic whatever the record timestamps);
- frames by byte position (``read_at``: from the file through a read-ahead buffer, or from the
  append buffer; the last two decoded are kept, so reading a batch record by record decodes it
  once), the index entry at or before an offset, and the bytes of frames (``raw``, for
  ``frames.py``); finding records by offset is ``segment_reads.py``'s, over these, with the
  position where the last walk stopped (``hint``) and the frame read last (``current``) kept
  here;
- the primitives recovery (``recovery.py``) rebuilds a segment with;
- compaction's side: ``install`` moves a compacted copy, written as a segment of its own
  elsewhere, over the files of the segment it replaces.

The segment never fsyncs by itself; ``sync`` (run by the flusher's worker thread) does, the
record file alone while the segment is active, the indexes too once it is sealed. Its three
files take descriptors from the log's file-handle cache (``storage_env.filecache``) only while
they are used; ``keep_open`` holds them for a segment whose names are about to go (an unlink, a
compacted copy installed over it) while a reader or a flush in flight may still use it.
"""

from __future__ import annotations

import logging
import mmap
from pathlib import Path

from ...storage_env.filecache import CachedFile, Directory, FileCache
from .format import (
    HEAD_SIZE,
    INDEX_ENTRY,
    RECORD_HEAD,
    TIME_ENTRY,
    Frame,
    RecordError,
    decode_frame,
)
from .index import SparseIndex

log = logging.getLogger(__name__)

READ_AHEAD = 64 * 1024


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class Segment:
    def __init__(
        self,
        cache: FileCache,
        directory: Directory,
        base_offset: int,
        index_interval_bytes: int,
        *,
        create: bool = True,
    ) -> None:
        self._cache = cache
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        files: list[CachedFile] = []
        try:  # creates the three files unless not ``create`` (a failure leaves no descriptor)
            for suffix in (".log", ".index", ".timeindex"):
                files.append(
                    cache.file(directory, segment_name(base_offset, suffix), create=create)
                )
        except BaseException:
            for file in files:
                file.close()
            raise
        self.file = files[0]
        # Offset index: relative offset -> file position; time index: timestamp -> relative
        # offset.
        self.offset_index = SparseIndex(files[1], INDEX_ENTRY, "I", "I")
        self.time_index = SparseIndex(files[2], TIME_ENTRY, "Q", "I")
        self.size = 0  # bytes of records in the file plus the buffer
        self.written = 0  # bytes of records already in the file
        self.next_offset = base_offset
        self.max_timestamp = -1
        self._buffer = bytearray()
        # Bytes of records since the last offset-index entry; ``index_interval_bytes`` while
        # there is none, so that the first record gets one.
        self._since_index = index_interval_bytes
        self.dirty = False  # records written since the last sync
        self.index_dirty = False  # index entries written since the last sync of the indexes
        self._read_pos = -1  # read-ahead cache: file position of _read_buf
        self._read_buf = b""
        # The last two frames decoded, newest first, by position (see ``read_at``).
        self._kept: list[tuple[int, Frame | None]] = [(-1, None), (-1, None)]
        # Where the last walk stopped: (least offset, file position) of the next record.
        self.hint = (-1, 0)
        # The frame (and its position) of the record read last: ``segment_reads.take_after``
        # goes on in it.
        self.current: tuple[Frame, int] | None = None

    def create_files(self) -> None:
        """Create the files of a segment made without (``create=False``: in a log that has no
        directory yet)."""
        for file in self.files:
            self._cache.create(file)

    @property
    def files(self) -> tuple[CachedFile, CachedFile, CachedFile]:
        return self.file, self.offset_index.file, self.time_index.file

    @property
    def log_path(self) -> Path:
        return self.file.path

    # -- appending ---------------------------------------------------------------------------

    def append(
        self, offset: int, timestamp_ms: int, frame: bytes, last_offset: int | None = None
    ) -> None:
        """Buffer a frame: a record with ``offset`` or a batch from ``offset`` to
        ``last_offset``, whose greatest timestamp is ``timestamp_ms``."""
        self.max_timestamp = max(self.max_timestamp, timestamp_ms)
        if self._since_index >= self.index_interval_bytes:
            self._add_index_entry(offset - self.base_offset, self.size)
        self._buffer += frame
        self.size += len(frame)
        self._since_index += len(frame)
        self.next_offset = (offset if last_offset is None else last_offset) + 1

    def _add_index_entry(self, relative: int, position: int) -> None:
        """Index the record at ``position`` (``max_timestamp`` already counts it). The time
        index gets the greatest timestamp so far, as Kafka's does, and only when it grew: it
        stays strictly increasing even when record timestamps are not, and every record before
        an entry's offset has a timestamp at or below the entry's."""
        self.offset_index.append(relative, position)
        stamps = self.time_index.keys
        if not stamps or self.max_timestamp > stamps[-1]:
            self.time_index.append(self.max_timestamp, relative)
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
                    written += self.file.pwrite(data[written:], self.written + written)
            except OSError:
                # Leave the file as it was before this call: a retry rewrites everything.
                self.file.ftruncate(self.written)
                raise
            if self._read_pos + len(self._read_buf) > self.written:
                # The read-ahead holds what the file had past the end (bytes a scan stopped
                # at, never cut): stale now that records are written over them.
                self._read_buf = b""
                self.forget_frame()
            self.written += len(data)
            self._buffer.clear()
            self.dirty = True
        if self.offset_index.write_out():
            self.index_dirty = True
        if self.time_index.write_out():
            self.index_dirty = True

    def sync(self, *, indexes: bool = True) -> None:
        """fdatasync the record file and (with ``indexes``) both indexes (worker thread). The
        active segment's group commits sync the record file alone: recovery rebuilds the
        indexes of every segment it rescans, and a segment is synced with its indexes once it
        is sealed, before a recovery point can pass it."""
        self.file.fdatasync()
        if indexes:
            self.offset_index.sync()
            self.time_index.sync()

    # -- reading -----------------------------------------------------------------------------

    def entry(self, i: int) -> tuple[int, int]:
        """File position and offset of index entry ``i`` (-1: the start of the segment)."""
        if i < 0:
            return 0, self.base_offset
        index = self.offset_index
        return index.values[i], self.base_offset + index.keys[i]

    def position_at_or_before(self, offset: int) -> tuple[int, int]:
        """Position and offset of the last index entry at or before ``offset`` (or the start)."""
        return self.entry(self.offset_index.find(offset - self.base_offset))

    def raw(self, pos: int, size: int) -> bytes:
        """Up to ``size`` bytes of frames from byte ``pos``: the file's, then the buffer's."""
        data = self.file.pread(min(size, self.written - pos), pos) if pos < self.written else b""
        if pos + size <= self.written or not self._buffer:
            return data
        start = max(pos - self.written, 0)
        return data + self._buffer[start : start + size - len(data)]

    def read_at(self, pos: int) -> Frame:
        """The frame at byte ``pos``. The last two decoded are kept: reading a batch record by
        record decodes it once, even for a reader that read ahead into the next frame and
        goes back. Raises ``RecordError`` if it is damaged or cut short."""
        kept = self._kept
        if kept[0][0] == pos:
            return kept[0][1]  # type: ignore[return-value]
        if kept[1][0] == pos:
            return kept[1][1]  # type: ignore[return-value]
        frame = self._decode_at(pos)
        kept[1] = kept[0]
        kept[0] = (pos, frame)
        return frame

    def forget_frame(self) -> None:
        """Drop the kept frames (a reader moved on to another segment)."""
        self._kept = [(-1, None), (-1, None)]

    def _decode_at(self, pos: int) -> Frame:
        if pos >= self.written:
            # Not written out yet (perhaps because writing fails: a full disk): read it from
            # the append buffer rather than write it out, which could raise OSError.
            frame = decode_frame(self._buffer, pos - self.written)
            if frame is None:
                raise RecordError(f"record at {self.log_path}:{pos} is cut short")
            return frame
        buf_start = self._read_pos
        if buf_start <= pos and pos + HEAD_SIZE <= buf_start + len(self._read_buf):
            (length, _crc) = RECORD_HEAD.unpack_from(self._read_buf, pos - buf_start)
            if pos + 4 + length <= buf_start + len(self._read_buf):
                frame = decode_frame(self._read_buf, pos - buf_start)
                if frame is not None:
                    return frame
        # Refill: at least the whole frame (its length is in the first 4 bytes).
        head = self.file.pread(READ_AHEAD, pos)
        if len(head) >= 4:
            length = int.from_bytes(head[:4], "big")
            if 4 + length > len(head) and pos + 4 + length <= self.written:
                head += self.file.pread(4 + length - len(head), pos + len(head))
        self._read_pos, self._read_buf = pos, head
        frame = decode_frame(head, 0)
        if frame is None:
            raise RecordError(f"record at {self.log_path}:{pos} is cut short")
        return frame

    # -- recovery's side (``recovery.py``) --------------------------------------------------

    def adopt_file(self) -> int:
        """Take the record file as it is: its length is the size, all of it written; returns
        it."""
        self.size = self.written = self.file.size()
        return self.size

    def map_records(self) -> mmap.mmap:
        """A read-only map of the record file's first ``size`` bytes (``size`` > 0)."""
        return self.file.map(self.size)

    def reset_indexes(self) -> None:
        """Forget both indexes and the greatest timestamp, before a scan finds them again."""
        self.offset_index.clear()
        self.time_index.clear()
        self._since_index = self.index_interval_bytes
        self.max_timestamp = -1

    def index_record(self, frame: Frame, position: int) -> None:
        """Count a frame found by a scan at ``position``, as ``append`` counts one."""
        self.max_timestamp = max(self.max_timestamp, frame.timestamp_ms)
        if self._since_index >= self.index_interval_bytes:
            self._add_index_entry(frame.offset - self.base_offset, position)
        self._since_index += frame.size

    def index_next_record(self) -> None:
        """The next record a scan counts gets an index entry (it follows a damaged one)."""
        self._since_index = self.index_interval_bytes

    def resume(self, next_offset: int, max_timestamp: int) -> None:
        """The loaded indexes hold and the records after the last entry end at ``next_offset``:
        appends go on from there."""
        self.next_offset = next_offset
        self.max_timestamp = max_timestamp
        self._since_index = self.size - self.offset_index.values[-1]

    def finish_scan(self, end: int, next_offset: int, *, cut: bool) -> None:
        """A scan found the records up to byte ``end`` (``cut``: cut the file there) and the
        next offset: adopt that and rewrite both index files from what it found."""
        self.next_offset = next_offset
        if cut:
            self.file.ftruncate(end)
        self.size = self.written = end
        self._read_pos, self._read_buf = -1, b""
        self.forget_frame()
        self.hint = (-1, 0)
        self.offset_index.rewrite()
        self.time_index.rewrite()
        self.write_out()

    def cut_at(self, pos: int) -> None:
        """Cut the record file at byte ``pos`` (a frame boundary; nothing buffered), before a
        rescan rebuilds the rest (``recovery.scan_segment``); the next sync makes it durable."""
        self.file.ftruncate(pos)
        self.size = self.written = pos
        self._read_pos, self._read_buf = -1, b""
        self.forget_frame()
        self.hint = (-1, 0)
        self.current = None
        self.dirty = True

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        for file in self.files:
            file.close()

    def delete(self) -> None:
        self.close()
        self._unlink_files()

    def keep_open(self) -> None:
        """Hold the descriptors until ``close``: the names are about to go (``unlink``, or a
        compacted copy installed over them) while this segment may still be read or synced."""
        for file in self.files:
            file.hold()

    def unlink(self) -> None:
        """Remove the files; the segment stays usable (``keep_open``) until ``close``."""
        self.keep_open()
        self._unlink_files()

    def _unlink_files(self) -> None:
        """The record file first: index files without one are orphans, which a start
        removes."""
        fs = self._cache.fs
        for path in (file.path for file in self.files):
            fs.unlink(path, missing_ok=True)

    def install(self, directory: Directory) -> None:
        """Move the files of this segment (a compacted copy, written and synced in another
        directory of the same file system) into ``directory``, over those of the segment with
        the same base offset. The replaced index files go first, then the record file is
        renamed over the old one (atomic), then the new indexes follow: a crash at any point
        leaves the old or the new record file, with its own indexes or none (rebuilt at the next
        start). The replaced segment must ``keep_open`` first if it may still be used. Making
        the renames durable (``fsync_dir``) is the caller's business."""
        fs = self._cache.fs
        for file in self.files[1:]:
            fs.unlink(directory.path / file.name, missing_ok=True)
        for file in self.files:
            self._cache.move_file(file, directory)
