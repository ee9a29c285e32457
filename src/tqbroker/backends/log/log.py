"""An append-only log: an ordered list of segments in one directory, Kafka style.

Responsibilities (``Log``: the segment list, and the operations that must keep it, its base
offsets and the record cache consistent):
- opening: recovery (``recovery.py``) gives the segments, an empty log gets its first one
  (a new log's: its entries made durable with its first records, not before);
- appending records with increasing offsets (one at a time, as a record batch, or a leader's
  frames verbatim: replication), rolling to a new segment by size and by age, and continuing
  past offsets that are never used (``roll_to``);
- cutting the log back (``truncate``; ``replication.py`` finds where);
- durability work for the flusher (``sync_work``): the record files written since, the indexes
  of sealed segments, the directory when segments were created or deleted; a failed fdatasync
  is final (``sync_failed``);
- segments leaving the list: below an offset (settled), past retention, replaced by a
  compacted copy (``replace_segment``), the directory moved (``move``) when the store is
  deleted; the clean-shutdown marker at ``close``.

Reads go through ``reader`` (``reader.py``), over the same segment list. Just over 400 lines,
as one job: every operation that changes the segment list is here, so that the list, its base
offsets and the record cache change together.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Callable, Sequence
from itertools import pairwise
from operator import itemgetter
from pathlib import Path
from typing import Final

from ...model import Message
from ...storage_env import StorageEnv
from ...storage_env.filecache import Directory
from .cache import RecordCache
from .format import encode_batch, encode_record
from .reader import LogReader
from .recovery import CLEAN_MARKER, recover_segments, scan_segment
from .replication import CheckedFrame, cut_position
from .segment import Segment

# Opening a directory to fsync it can fail for want of descriptors: nothing was synced, nothing
# lost, and the next flush tries again (a failed fsync itself is final: ``sync_failed``).
OPEN_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE})
# Reading a file can fail for want of descriptors or memory: the file is fine, the caller fails.
RESOURCE_ERRNOS: Final = OPEN_ERRNOS | {errno.ENOMEM}

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
        lazy: bool = False,
    ) -> None:
        # The file system and file-handle cache it works through (None: a new real one).
        self.env = StorageEnv.default() if env is None else env
        # Shared with every segment of the log: ``move`` renames it for all of them at once.
        self._directory = Directory(directory)
        self.segment_bytes = segment_bytes
        self.compression = 0  # the codec of the batches appended (Kafka's ids; 0: none)
        self.segment_ms = segment_ms
        self.index_interval_bytes = index_interval_bytes
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.cache = cache if cache is not None else RecordCache(0)
        self._cache_id, self._cached = self.cache.register()
        self._segment_created_ms = 0
        self.sync_failed = False  # an fdatasync failed: nothing written since can be trusted
        self._directory_dirty = False  # a segment was created since the last sync
        # The first segment of a new log: its entries become durable with its first records
        # (a directory fsync per new queue at declare would cost 10,000 for an import).
        self._entries_unsynced = False
        self.created = False  # ``open`` found no segment: a new log (or one lost whole)
        # ``lazy``: a log whose directory does not exist opens ``absent``, nothing created on
        # disk until something is written (``materialize``; a new queue's: an import of
        # 10,000 durable queues paid ~0.5 ms a file create). Under _absent_lock.
        self._lazy = lazy
        self.absent = False
        self._moved_absent = False  # ``move``d while absent: nothing may be written any more
        self._absent_lock = threading.Lock()
        # Called once the directory of an absent log is created, before its files are.
        self.on_materialize: Callable[[], None] = _nothing
        # Reads (with ``strict``, ``failure``, ``corrupt_records``), over these segments.
        self.reader = LogReader(self._directory, self.segments, self._bases, self._cached)
        # Called whenever the log (or its store) gets something for the next flush to do: the
        # backend flushes only the stores that called it (see ``LogBackend``).
        self.changed: Callable[[], None] = _nothing

    @property
    def directory(self) -> Path:
        return self._directory.path

    # -- opening -----------------------------------------------------------------------------

    def open(self, *, recovery_point: int = 0) -> bool:
        """Open (creating if needed; a ``lazy`` log without a directory opens ``absent``) and
        recover (``recovery.recover_segments``). Returns True when the previous run closed
        cleanly. Segments at or after ``recovery_point`` (the first offset not known to be
        fsync'd) are scanned when the shutdown was not clean."""
        if self._lazy and not self.directory.is_dir():
            # A new log (or one a power cut took before anything in it was confirmed): its
            # first segment, its files and its directory are made by its first write.
            self.created = self.absent = True
            self._roll(0)
            self._directory_dirty = False
            return False
        segments, clean = recover_segments(
            self.env,
            self._directory,
            self.index_interval_bytes,
            recovery_point=recovery_point,
            strict=self.reader.strict,
        )
        for segment in segments:
            self._add(segment)
        self.created = not segments
        if self.created:
            # Nothing recovered, nothing to make durable: the new segment's entries can wait
            # for its first records (``sync_work``); a power cut before leaves an empty log.
            self._roll(0)
            self._directory_dirty, self._entries_unsynced = False, True
        elif not clean:
            # Recovery may have truncated or removed files: the first sync makes that durable
            # before anything appended since is confirmed.
            self._directory_dirty = True
        self._segment_created_ms = _now_ms()
        return clean

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
        with self._absent_lock:  # an absent log's files are created by ``materialize``
            files, interval = self.env.files, self.index_interval_bytes
            self._add(
                Segment(files, self._directory, base_offset, interval, create=not self.absent)
            )
        self._segment_created_ms = _now_ms()
        self._directory_dirty = True
        self.changed()

    def materialize(self) -> None:
        """Create the directory and the files of an ``absent`` log (any thread; OSError: as it
        was, the next write tries again). Its entries are made durable by the first sync."""
        if not self.absent:
            return
        with self._absent_lock:
            if not self.absent:
                return
            if self._moved_absent:
                raise FileNotFoundError(errno.ENOENT, "the log was deleted", str(self.directory))
            self.env.fs.mkdir(self.directory, exist_ok=True)
            self.on_materialize()
            for segment in self.segments:
                segment.create_files()
            self._entries_unsynced = True
            self.absent = False

    # -- appending ---------------------------------------------------------------------------

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
        if self.absent:  # a new log's first record: its files first, or the append fails
            self.materialize()  # OSError: nothing appended (the publish alone is refused)
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
                self.write_out()
        return offset

    def append_batch(self, entries: list[tuple[int, int, Message]]) -> int:
        """Append ``entries`` (``(timestamp_ms, flags, message)``; a timestamp of 0: now) as
        one record batch (buffered; one entry is written as a record); return the first
        offset. The batch goes to the record cache too. All or nothing: OSError (a segment to
        roll to cannot be created) leaves the log as it was."""
        if self.absent:  # as in ``append``
            self.materialize()
        if 0 in map(_first, entries):  # C-level loops: a batch has thousands of entries
            now = _now_ms()
            entries = [(stamp or now, flags, message) for stamp, flags, message in entries]
        active = self.segments[-1]
        offset = active.next_offset
        if len(entries) == 1:  # a record of its own: a batch of one would cost 21 B more
            stamp, flags, message = entries[0]
            frame = encode_record(offset, stamp, flags, message)
        else:
            frame = encode_batch(offset, entries, self.compression)
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
                self.write_out()
        return offset

    def append_frame(self, offset: int, last: int, timestamp_ms: int, frame: bytes) -> None:
        """Append one frame this process encoded (a Kafka batch), as ``append_frames`` does."""
        if self.absent:  # as in ``append``
            self.materialize()
        self.append_frames([CheckedFrame(offset, last, timestamp_ms, frame)])

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
                self.write_out()

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
        self._forget_reads()
        return end, removed

    def restart_at(self, offset: int) -> list[Segment]:
        """Remove every record and continue at ``offset`` in a new, empty segment (Kafka's
        ``truncateFullyAndStartAt``; blocking like ``truncate``): every segment is detached
        and its files unlinked (kept open, as ``truncate``'s), and a failure (a damaged frame
        a strict read met) is forgotten with them. Returns the detached segments.
        The caller makes it durable (``sync_work``)."""
        self.write_out()
        removed = self.segments[::-1]  # the newest first
        self.segments.clear()
        self._bases.clear()
        for segment in removed:
            segment.unlink()
        self._directory_dirty = True
        self._roll(offset)
        self._forget_reads()
        self.reader.failure = None  # the damaged frame went with the rest
        return removed

    def _forget_reads(self) -> None:
        # Nothing read or cached before may be served again: the offsets may be reused.
        self.cache.unregister(self._cache_id)
        self._cache_id, self._cached = self.cache.register()
        self.reader.reset(self._cached)
        self.changed()

    def gaps(self) -> list[tuple[int, int]]:
        """The ``[start, end)`` offset ranges between segments, which hold no record: a crash
        lost the buffered records of a segment rolled since the last write, ``roll_to``
        skipped them, or compaction removed them (with the gaps inside segments it leaves)."""
        return [
            (segment.next_offset, later.base_offset)
            for segment, later in pairwise(self.segments)
            if segment.next_offset < later.base_offset
        ]

    # -- durability --------------------------------------------------------------------------

    def write_out(self) -> None:
        """Push buffered bytes to the page cache (may raise OSError): the active segment's and
        those of segments rolled since the last call (an absent log's files created first)."""
        for segment in self.segments:
            if segment.pending:
                self.materialize()
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
        # A new log's first segment: its entries wait for records to sync (``open``).
        directory = not self.absent and (
            self._directory_dirty or (self._entries_unsynced and bool(work))
        )
        self._directory_dirty = False
        if directory:
            self._entries_unsynced = False
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
        """Detach the oldest segments that retention removes (``past_retention``; never the
        active one). The caller deletes them (``Segment.delete``)."""
        now_ms = _now_ms() if now_ms is None else now_ms
        count = past_retention(self.segments, max_bytes, max_age_ms, now_ms)
        removed = self.segments[:count]
        del self.segments[:count], self._bases[:count]
        return removed

    def move(self, target: Path) -> None:
        """Rename the log's directory to ``target`` (the queue is being deleted): every segment,
        detached ones included, reopens its files there from now on. An absent log has none:
        nothing is written for it any more."""
        with self._absent_lock:
            if self.absent:
                self._directory.path = target
                self._moved_absent = True
                return
        self.env.files.move(self._directory, target)

    def install(self, segment: Segment) -> None:
        """Move a compacted copy (``Segment.install``) into the log's directory."""
        segment.install(self._directory)

    def close(self, *, clean: bool) -> None:
        """Close every file; with ``clean`` (after a final sync) leave the clean marker (an
        absent log leaves nothing: it opens as a new one)."""
        if clean and not self.absent:
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


def past_retention(
    segments: Sequence[Segment], max_bytes: int | None, max_age_ms: int | None, now_ms: int
) -> int:
    """How many of the oldest segments retention removes, Kafka's way (per whole segment):
    while dropping the oldest still leaves at least ``max_bytes``, or while the oldest's newest
    record is older than ``max_age_ms``. The last (active) segment always stays."""
    total = sum(s.size for s in segments)
    count = 0
    while count < len(segments) - 1:
        oldest = segments[count]
        too_big = max_bytes is not None and total - oldest.size >= max_bytes
        too_old = max_age_ms is not None and oldest.max_timestamp < now_ms - max_age_ms
        if not (too_big or too_old):
            break
        total -= oldest.size
        count += 1
    return count
