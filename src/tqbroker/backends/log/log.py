"""An append-only log: an ordered list of segments in one directory, Kafka style.

Responsibilities:
- append records with increasing offsets, rolling to a new segment by size and by age;
- read a record by offset (segment by binary search, then the segment's sparse index), the first
  record at or after an offset (segments compacted by a stream have gaps), or every record from
  an offset on;
- find the first offset at or after a timestamp (the time index);
- recovery: a clean-shutdown marker means the files are trusted; otherwise every segment from the
  recovery point on is scanned, the torn tail truncated at the first bad record and later
  segments discarded, and indexes rebuilt; orphan index files and the leftovers of an unfinished
  compaction (``COMPACTION_DIR``) are removed;
- durability work for the flusher (``sync_work``), deleting whole segments below an offset;
- putting a compacted copy in place of a closed segment (``replace_segment``);
- replication's side (``replication.py`` checks the frames and finds where to cut): appending
  frames verbatim (``append_frames``) and cutting the log back (``truncate``);
- ``strict`` (streams): a damaged frame a read meets fails the log (``failure``) and raises
  ``CorruptLogError`` instead of being stepped over; and recovery drops an empty last segment
  that would leave a hole at the end of the log.

Over 400 lines, as one job: the segment list and the operations that must keep it, its
offset bisection and the record cache consistent.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from functools import partial
from itertools import pairwise
from operator import itemgetter
from pathlib import Path
from typing import Final

from ...model import Message
from ...storage_env import StorageEnv
from ...storage_env.filecache import Directory
from ..streams import CorruptLogError
from .cache import RecordCache
from .format import (
    Batch,
    Frame,
    Record,
    RecordError,
    encode_batch,
    encode_record,
    first_at_or_after,
    parse_frame,
    records_after,
)
from .frames import read_frames
from .recovery import load_segment, scan_segment
from .replication import CheckedFrame, cut_position
from .retention import past_retention
from .segment import Segment

log = logging.getLogger(__name__)

# Opening a directory to fsync it can fail for want of descriptors: nothing was synced, nothing
# lost, and the next flush tries again (a failed fsync itself is final: ``sync_failed``).
OPEN_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE})
# Reading a file can fail for want of descriptors or memory: the file is fine, the caller fails.
RESOURCE_ERRNOS: Final = OPEN_ERRNOS | {errno.ENOMEM}

CLEAN_MARKER = "clean-shutdown"
_NO_FRAME: Final[Frame] = Batch(-1, -1, [], 0)
# Where compacted copies of segments are written before they are moved over the originals.
COMPACTION_DIR = "compaction.tmp"
_first = itemgetter(0)


class Log:
    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 64 * 1024 * 1024,
        segment_ms: int = 7 * 24 * 3600 * 1000,
        index_interval_bytes: int = 4096,
        cache: RecordCache | None = None,
        env: StorageEnv | None = None,
    ) -> None:
        # The file system and file-handle cache it works through (None: a new real one).
        self.env = StorageEnv.default() if env is None else env
        # Shared with every segment of the log: ``move`` renames it for all of them at once.
        self._directory = Directory(directory)
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self.index_interval_bytes = index_interval_bytes
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.cache = cache if cache is not None else RecordCache(0)
        self._cache_id, self._cached = self.cache.register()
        self._segment_created_ms = 0
        self.corrupt_records = 0
        # Strict (streams): a damaged frame fails the log (``failure``) and every read raises
        # ``CorruptLogError``; otherwise (queues) reads step over it, losing only it.
        self.strict = False
        self.failure: str | None = None
        self.sync_failed = False  # an fdatasync failed: nothing written since can be trusted
        self._directory_dirty = False  # a segment was created since the last sync
        self._reading: Segment | None = None  # the segment read last (it keeps a frame)
        # The last two frames decoded from the cache, newest first (see ``_from_cache``).
        self._cache_frames: list[tuple[bytes, Frame]] = [(b"", _NO_FRAME), (b"", _NO_FRAME)]
        self._cache_hit = 0  # which of them the last cached read came from
        self._source: Segment | None = None  # where the last read_from found its record
        # Called whenever the log (or its store) gets something for the next flush to do: the
        # backend flushes only the stores that called it (see ``LogBackend``).
        self.changed: Callable[[], None] = _nothing

    @property
    def directory(self) -> Path:
        return self._directory.path

    # -- opening -----------------------------------------------------------------------------

    def open(self, *, recovery_point: int = 0) -> bool:
        """Open (creating if needed) and recover. Returns True when the previous run closed
        cleanly. Segments at or after ``recovery_point`` (the first offset not known to be
        fsync'd) are scanned when the shutdown was not clean."""
        self.env.fs.mkdir(self.directory, parents=True, exist_ok=True)
        marker = self.directory / CLEAN_MARKER
        clean = marker.exists()
        self.env.fs.rmtree(self.directory / COMPACTION_DIR)
        bases = sorted(
            int(p.name[:20]) for p in self.directory.glob("*.log") if p.name[:20].isdigit()
        )
        self._remove_orphans(set(bases))
        for i, base in enumerate(bases):
            segment = Segment(self.env.files, self._directory, base, self.index_interval_bytes)
            self._add(segment)  # closed with the log if what follows fails
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            # Trusted: the segments a recovery point passed. One that ends exactly at it may
            # have been the active segment when that checkpoint was written, its indexes not
            # synced yet: rescanned.
            if clean or (next_base is not None and next_base < recovery_point):
                load_segment(segment, next_base)
            elif not scan_segment(segment):
                segment.forget_frame()
                self._drop_after(i, bases)
                break
            segment.forget_frame()  # what the load decoded last
        if self.strict and not clean:
            self._drop_empty_tail()
        if marker.exists():
            self.env.fs.unlink(marker)
            self.env.fsync_dir(self.directory)
        if not self.segments:
            self._roll(0)
        # After a crash recovery may have truncated or removed files: the first sync makes
        # that durable before anything appended since is confirmed.
        self._directory_dirty = self._directory_dirty or not clean
        self._segment_created_ms = _now_ms()
        return clean

    def _remove_orphans(self, bases: set[int]) -> None:
        for path in self.directory.iterdir():
            base = path.name[:20]
            orphan = base.isdigit() and int(base) not in bases
            if path.suffix in (".index", ".timeindex") and orphan:
                log.info("removing orphan index file %s", path)
                self.env.fs.unlink(path)

    def _drop_empty_tail(self) -> None:
        """A crash kept a segment rolled to but not the records buffered in the one before
        (written out after the roll): the empty segment would leave the offsets in between a
        hole that no record fills (a follower fetching from the end would never copy them).
        It goes, and the log ends where its records do (none of those offsets was durable,
        so no reader saw one)."""
        while (
            len(self.segments) > 1
            and self.segments[-1].size == 0
            and self.segments[-2].next_offset < self.segments[-1].base_offset
        ):
            segment = self.segments.pop()
            self._bases.pop()
            log.warning(
                "%s: removing empty segment %d after a hole", self.directory, segment.base_offset
            )
            segment.delete()

    def _drop_after(self, i: int, bases: list[int]) -> None:
        """A segment was truncated: every later segment is unreachable garbage."""
        for base in bases[i + 1 :]:
            log.warning("%s: discarding segment %d after a truncated one", self.directory, base)
            Segment(self.env.files, self._directory, base, self.index_interval_bytes).delete()

    def _add(self, segment: Segment) -> None:
        self.segments.append(segment)
        self._bases.append(segment.base_offset)

    def roll_to(self, offset: int) -> None:
        """Continue the log at ``offset`` (beyond its end) in a new segment: the offsets in
        between are never used."""
        if offset > self.next_offset:
            self.write_out()
            self._roll(offset)

    def _roll(self, base_offset: int) -> None:
        # The old segment's buffered records are written out by the next ``write_out``; the
        # next sync makes the new files' directory entries durable.
        self._add(Segment(self.env.files, self._directory, base_offset, self.index_interval_bytes))
        self._segment_created_ms = _now_ms()
        self._directory_dirty = True
        self.changed()

    # -- appending and reading ---------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def next_offset(self) -> int:
        return self.segments[-1].next_offset

    def append(
        self, message: Message, flags: int, timestamp_ms: int | None = None, *, hot: bool = True
    ) -> int:
        """Append a record (buffered); return its offset. Its timestamp is ``timestamp_ms``,
        else the message's, else (a message never stamped) now. ``hot`` records (about to be
        read) go to the record cache too."""
        if timestamp_ms is None:
            timestamp_ms = message.timestamp_ms or _now_ms()
        active = self.segments[-1]
        offset = active.next_offset
        record = encode_record(offset, timestamp_ms, flags, message)
        if active.size and (
            active.size + len(record) > self.segment_bytes
            or timestamp_ms - self._segment_created_ms > self.segment_ms
        ):
            self._roll(offset)
            active = self.segments[-1]
        active.append(offset, timestamp_ms, record)
        self.changed()
        if hot and self.cache.max_bytes:
            self.cache.put(self._cache_id, offset, record)
        if active.pending >= 256 * 1024:
            # On failure the record stays buffered: the next flush retries the write and
            # reports the error (the broker nacks); raising here would fail the publish path.
            with contextlib.suppress(OSError):
                active.write_out()
        return offset

    def append_batch(self, entries: list[tuple[int, int, Message]]) -> int:
        """Append ``entries`` (``(timestamp_ms, flags, message)``; a timestamp of 0: now) as
        one record batch (buffered; one entry is written as a record); return the first
        offset. The batch goes to the record cache too. All or nothing: OSError (a segment to
        roll to cannot be created) leaves the log as it was."""
        if 0 in map(_first, entries):  # C-level loops: a batch has thousands of entries
            now = _now_ms()
            entries = [(stamp or now, flags, message) for stamp, flags, message in entries]
        active = self.segments[-1]
        offset = active.next_offset
        if len(entries) == 1:  # a record of its own: a batch of one would cost 21 B more
            stamp, flags, message = entries[0]
            frame = encode_record(offset, stamp, flags, message)
        else:
            frame = encode_batch(offset, entries)
        last = offset + len(entries) - 1
        max_timestamp = max(map(_first, entries))
        if active.size and (
            active.size + len(frame) > self.segment_bytes
            or max_timestamp - self._segment_created_ms > self.segment_ms
        ):
            self._roll(offset)
            active = self.segments[-1]
        active.append(offset, max_timestamp, frame, last)
        self.changed()
        if self.cache.max_bytes:
            self.cache.put(self._cache_id, offset, frame, last)
        if active.pending >= 256 * 1024:
            with contextlib.suppress(OSError):  # as in ``append``
                active.write_out()
        return offset

    def append_frames(self, frames: list[CheckedFrame]) -> None:
        """Append frames verbatim (buffered; ``replication.check_frames`` validated them),
        each at the offsets it carries, rolling as ``append_batch`` does; the cache gets them
        too. Raises OSError (a segment to roll to cannot be created): the frames before the
        one refused stay appended."""
        try:
            for offset, last, stamp, data in frames:
                active = self.segments[-1]
                if active.size and (
                    active.size + len(data) > self.segment_bytes
                    or stamp - self._segment_created_ms > self.segment_ms
                ):
                    self._roll(offset)
                    active = self.segments[-1]
                active.append(offset, stamp, data, last)
                if self.cache.max_bytes:
                    self.cache.put(self._cache_id, offset, data, last)
        finally:
            self.changed()
        if self.segments[-1].pending >= 256 * 1024:
            with contextlib.suppress(OSError):  # as in ``append``
                self.segments[-1].write_out()

    def truncate(self, offset: int) -> tuple[int, list[Segment]]:
        """Cut the log back so that no record at or past ``offset`` is left (blocking: it
        writes out, cuts a file and rescans what is left of it): the segments wholly past it
        are detached and their files unlinked (kept open: the caller closes them once no
        flush in flight can use them), the one that holds it cut at a frame boundary
        (``replication.cut_position``) and its indexes rebuilt. Returns the offset the log
        ends at now, and the detached segments. The caller makes it durable (``sync_work``)."""
        self.write_out()
        removed: list[Segment] = []
        while self.segments and self.segments[-1].base_offset >= offset:
            removed.append(self.segments.pop())
            self._bases.pop()
        end = offset
        if self.segments:
            segment = self.segments[-1]
            pos, end = cut_position(segment, offset)
            if pos < segment.size:
                segment.cut_at(pos)
                scan_segment(segment)
                segment.forget_frame()
        for segment in removed:  # the newest first
            segment.unlink()
        self._directory_dirty = self._directory_dirty or bool(removed)
        if not self.segments:
            self._roll(end)
        # Nothing read or cached before may be served again: the offsets may be reused.
        self.cache.unregister(self._cache_id)
        self._cache_id, self._cached = self.cache.register()
        self._cache_frames = [(b"", _NO_FRAME), (b"", _NO_FRAME)]
        self._reading = self._source = None
        self.changed()
        return end, removed

    def read(self, offset: int) -> Record | None:
        """The record at ``offset``; None if it is not in the log. A record that fails its
        CRC is logged and counted, then treated as absent, or with ``strict`` raises
        ``CorruptLogError``: a corrupt body is never returned."""
        i = bisect_right(self._bases, offset) - 1
        if i < 0:
            return None
        segment = self.segments[i]
        if i == len(self.segments) - 1:
            cached = self._cached.find(offset)
            if cached is not None:
                record = self._from_cache(cached, offset)
                return record if record is not None and record.offset == offset else None
        self._reading_in(segment)
        try:
            return segment.read(offset)
        except RecordError as exc:
            if self.strict:
                self._damaged(segment, exc)  # raises
            self.corrupt_records += 1
            log.error("%s: offset %d is corrupt (%s); skipping it", segment.log_path, offset, exc)
            return None

    def read_from(self, offset: int) -> Record | None:
        """The first intact record at or after ``offset`` (None: none yet). Damaged records on
        the way are logged, counted and stepped over, or with ``strict`` raise, as ``read``
        does."""
        self._source = None
        i = max(bisect_right(self._bases, offset) - 1, 0)
        last = len(self.segments) - 1
        for j in range(i, last + 1):
            segment = self.segments[j]
            if j == last:  # the active segment: no gaps, so the wanted offset may be cached
                cached = self._cached.find(max(offset, segment.base_offset))
                if cached is not None:
                    return self._from_cache(cached, offset)
            self._reading_in(segment)
            record = segment.read_next(offset) or segment.read_from(
                offset, partial(self._damaged, segment)
            )
            if record is not None:
                self._source = segment
                return record
        return None

    def read_many(self, offset: int, end: int, limit: int) -> list[Record]:
        """Up to ``limit`` intact records from the first at or after ``offset``, all below
        ``end``: the rest of each batch is taken at once (decoded once: the cache and the
        segments keep the last frames they decoded)."""
        found: list[Record] = []
        while len(found) < limit and offset < end:
            record = self.read_from(offset)
            if record is None or record.offset >= end:
                break
            found.append(record)
            room = limit - len(found)
            if room:
                source = self._source
                if source is not None:
                    found += source.take_after(record, end, room)
                else:
                    found += self._cached_after(record, end, room)
            offset = found[-1].offset + 1
        return found

    def read_frames(
        self, offset: int, end: int, max_bytes: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """``frames.read_frames``: a damaged frame on the way raises ``CorruptLogError``."""
        i = max(bisect_right(self._bases, offset) - 1, 0)
        return read_frames(self.segments[i:], offset, end, max_bytes, self._damaged)

    def _cached_after(self, record: Record, end: int, limit: int) -> list[Record]:
        """``Segment.take_after`` for a record the cache gave (its frame the newest kept)."""
        return records_after(self._cache_frames[self._cache_hit][1], record, end, limit)

    def _from_cache(self, frame_bytes: bytes, offset: int) -> Record | None:
        """The first record at or after ``offset`` of a cached frame, decoded once: the last
        two frames decoded from the cache are kept (a reader that read ahead into the next
        batch and goes back to where it stopped finds both)."""
        kept = self._cache_frames
        if kept[0][0] is frame_bytes:
            frame, self._cache_hit = kept[0][1], 0
        elif kept[1][0] is frame_bytes:
            frame, self._cache_hit = kept[1][1], 1
        else:
            frame = parse_frame(frame_bytes)  # our own bytes: no CRC to check
            kept[1] = kept[0]
            kept[0] = (frame_bytes, frame)
            self._cache_hit = 0
        i = first_at_or_after(frame, offset)
        return frame.records[i] if i is not None else None

    def _reading_in(self, segment: Segment) -> None:
        """Reads go to ``segment`` now: the frame kept by the segment read before is let go
        (each segment keeps the last frame it decoded)."""
        if self._reading is not segment:
            if self._reading is not None:
                self._reading.forget_frame()
            self._reading = segment

    def _damaged(self, segment: Segment, exc: RecordError) -> None:
        """A read met a damaged frame: counted and logged; with ``strict`` the log is failed
        (``failure``) and the read raises ``CorruptLogError``, else it steps over it."""
        self.corrupt_records += 1
        if not self.strict:
            log.error("%s: a record is corrupt (%s); skipping it", segment.log_path, exc)
            return
        if self.failure is None:
            self.failure = f"damaged frame in {segment.log_path}: {exc}"
            log.error(
                "%s: FAILED: a damaged frame below the durable end, in segment %s (%s); the "
                "stream serves no more reads until it is repaired",
                self.directory,
                segment.log_path.name,
                exc,
            )
        raise CorruptLogError(errno.EIO, self.failure)

    def check_failed(self) -> None:
        """Raise ``CorruptLogError`` if the log is failed (a read met damage before)."""
        if self.failure is not None:
            raise CorruptLogError(errno.EIO, self.failure)

    def gaps(self) -> list[tuple[int, int]]:
        """The ``[start, end)`` offset ranges between segments, which hold no record: a crash
        lost the buffered records of a segment rolled since the last write, ``roll_to``
        skipped them, or compaction removed them (with the gaps inside segments it leaves)."""
        return [
            (segment.next_offset, later.base_offset)
            for segment, later in pairwise(self.segments)
            if segment.next_offset < later.base_offset
        ]

    def records(self, start: int) -> Iterator[Record]:
        """The intact records from offset ``start`` to the end of the log, in order (read from
        the segments, not the cache; damaged records are stepped over without a report)."""
        i = max(bisect_right(self._bases, start) - 1, 0)
        for segment in self.segments[i:]:
            yield from segment.records(start)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose timestamp is >= ``timestamp_ms`` (the log end if none); with
        ``strict``, a damaged frame on the way raises ``CorruptLogError``."""
        for segment in self.segments:
            on_damage = partial(self._damaged, segment) if self.strict else None
            found = segment.offset_for_timestamp(timestamp_ms, on_damage)
            if found is not None:
                return found
        return self.next_offset

    # -- durability --------------------------------------------------------------------------

    def write_out(self) -> None:
        """Push buffered bytes to the page cache (may raise OSError): the active segment's and
        those of segments rolled since the last call."""
        for segment in self.segments:
            if segment.pending:
                segment.write_out()

    @property
    def needs_sync(self) -> bool:
        """Whether ``sync_work`` has something to do: buffered or unsynced records, a sealed
        segment's unsynced indexes, or directory entries (segments created or deleted)."""
        active = self.segments[-1]
        return self._directory_dirty or any(
            s.pending or s.dirty or (s.index_dirty and s is not active) for s in self.segments
        )

    def sync_work(self) -> Callable[[], None] | None:
        """Write out what is buffered and return the fsync work (None if nothing): the record
        file of every segment written since the last call, the indexes of sealed segments
        not synced since they were written (an active segment's are rebuilt by the rescan
        after a crash), and the directory when a segment was created (its entries)."""
        self.write_out()
        active = self.segments[-1]
        work: list[tuple[Segment, bool]] = []
        for segment in self.segments:
            indexes = segment.index_dirty and segment is not active
            if segment.dirty or indexes:
                work.append((segment, indexes))
                segment.dirty = False
                if indexes:
                    segment.index_dirty = False
        directory, self._directory_dirty = self._directory_dirty, False
        if not work and not directory:
            return None

        def sync() -> None:
            try:
                for segment, indexes in work:
                    segment.sync(indexes=indexes)
            except OSError:
                # After a failed fdatasync the kernel may have dropped the dirty pages: a retry
                # could "succeed" over lost data. The log stops taking durable writes.
                self.sync_failed = True
                raise
            if directory:
                try:
                    self.env.fsync_dir(self.directory)
                except FileNotFoundError:
                    pass  # deleted meanwhile (moved to the trash): nothing left to make durable
                except OSError as exc:
                    self._directory_dirty = True  # the next flush tries again
                    if exc.errno not in OPEN_ERRNOS:  # the fsync failed, not the open
                        self.sync_failed = True
                    raise

        return sync

    def segments_deleted(self) -> None:
        """The caller deleted detached segments (worker thread): the next sync makes the
        unlinks durable."""
        self._directory_dirty = True
        self.changed()

    def delete_segments_below(self, offset: int) -> list[Segment]:
        """Detach the segments whose every record is below ``offset`` (never the active one);
        the caller deletes them (``Segment.delete``) once it is safe."""
        removed: list[Segment] = []
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            removed.append(self.segments.pop(0))
            self._bases.pop(0)
        return removed

    def replace_segment(self, old: Segment, new: Segment | None) -> bool:
        """Put ``new`` (a compacted copy of ``old``: same base offset, files in place) where the
        closed segment ``old`` was, or with None just drop ``old`` (nothing of it is left).
        False if ``old`` is not in the log (retention took it). The caller closes ``old``."""
        for i, segment in enumerate(self.segments[:-1]):  # never the active segment
            if segment is old:
                if new is None:
                    del self.segments[i], self._bases[i]
                else:
                    self.segments[i] = new
                return True
        return False

    def segments_past_retention(
        self,
        *,
        max_bytes: int | None = None,
        max_age_ms: int | None = None,
        now_ms: int | None = None,
    ) -> list[Segment]:
        """Detach the oldest segments that retention removes (``retention.past_retention``;
        never the active one). The caller deletes them (``Segment.delete``)."""
        now_ms = _now_ms() if now_ms is None else now_ms
        count = past_retention(self.segments, max_bytes, max_age_ms, now_ms)
        removed = self.segments[:count]
        del self.segments[:count], self._bases[:count]
        return removed

    def move(self, target: Path) -> None:
        """Rename the log's directory to ``target`` (the queue is being deleted): every segment,
        detached ones included, reopens its files there from now on."""
        self.env.files.move(self._directory, target)

    def install(self, segment: Segment) -> None:
        """Move a compacted copy (``Segment.install``) into the log's directory."""
        segment.install(self._directory)

    def close(self, *, clean: bool) -> None:
        """Close every file; with ``clean`` (after a final sync) leave the clean marker."""
        if clean:
            self.env.fs.write_file(self.directory / CLEAN_MARKER, b"")
            self.env.fsync_dir(self.directory)
        for segment in self.segments:
            segment.close()
        self.segments.clear()
        self._bases.clear()
        self.cache.unregister(self._cache_id)


def _nothing() -> None:
    pass


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
