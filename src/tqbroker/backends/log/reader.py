"""Reading a log (``LogReader``): its records by offset, after an offset, by timestamp, and
its frames as they lie on disk.

Responsibilities:
- a record by offset: the segment by binary search over the base offsets, then the record
  cache (the active segment's hot records) or the segment (``segment_reads.py``: its sparse
  index, then a walk); the first record at or after an offset (segments compacted by a stream
  have gaps), many of them at once (the rest of a batch is taken at once), every record from an
  offset on;
- the first offset at or after a timestamp (the time indexes);
- frames for bulk readers (``frames.py``);
- decoding each frame once: the last two frames decoded from the cache are kept, and each
  segment keeps the last it decoded (while reads stay in it);
- damage: a damaged frame a read meets is counted (``corrupt_records``) and logged, then stepped
  over, losing only it; or with ``strict`` (streams) it fails the log (``failure``) and this read
  and every later one raise ``CorruptLogError``: a corrupt body is never returned.

The segment list is the log's (``Log`` changes it, in place); reads never change it.
"""

from __future__ import annotations

import errno
import logging
from bisect import bisect_right
from collections.abc import Iterator
from functools import partial
from typing import Final

from ...storage_env.filecache import Directory
from ..streams import CorruptLogError
from . import segment_reads
from .cache import CachedFrames
from .format import Batch, Frame, Record, RecordError, first_at_or_after, parse_frame, records_after
from .frames import read_frames
from .segment import Segment

log = logging.getLogger(__name__)

_NO_FRAME: Final[Frame] = Batch(-1, -1, [], 0)


class LogReader:
    def __init__(
        self, directory: Directory, segments: list[Segment], bases: list[int], cached: CachedFrames
    ) -> None:
        self._directory = directory
        # The log's segments and their base offsets (kept by the log: never changed here).
        self._segments = segments
        self._bases = bases
        self._cached = cached  # the log's records in the record cache
        # Strict (streams): a damaged frame fails the log (``failure``) and every read raises
        # ``CorruptLogError``; otherwise (queues) reads step over it, losing only it.
        self.strict = False
        self.failure: str | None = None
        self.corrupt_records = 0
        self._reading: Segment | None = None  # the segment read last (it keeps a frame)
        # The last two frames decoded from the cache, newest first (see ``_from_cache``).
        self._cache_frames: list[tuple[bytes, Frame]] = [(b"", _NO_FRAME), (b"", _NO_FRAME)]
        self._cache_hit = 0  # which of them the last cached read came from
        self._source: Segment | None = None  # where the last read_from found its record

    def reset(self, cached: CachedFrames) -> None:
        """The log was cut back: nothing read or cached before may be served again (the
        offsets may be reused); ``cached`` is its new view of the record cache."""
        self._cached = cached
        self._cache_frames = [(b"", _NO_FRAME), (b"", _NO_FRAME)]
        self._reading = self._source = None

    def read(self, offset: int) -> Record | None:
        """The record at ``offset``; None if it is not in the log. A record that fails its
        CRC is logged and counted, then treated as absent, or with ``strict`` raises
        ``CorruptLogError``: a corrupt body is never returned."""
        i = bisect_right(self._bases, offset) - 1
        if i < 0:
            return None
        segments = self._segments
        segment = segments[i]
        if i == len(segments) - 1:
            cached = self._cached.find(offset)
            if cached is not None:
                record = self._from_cache(cached, offset)
                return record if record is not None and record.offset == offset else None
        self._reading_in(segment)
        try:
            return segment_reads.read(segment, offset)
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
        segments = self._segments
        last = len(segments) - 1
        for j in range(i, last + 1):
            segment = segments[j]
            if j == last:  # the active segment: no gaps, so the wanted offset may be cached
                cached = self._cached.find(max(offset, segment.base_offset))
                if cached is not None:
                    return self._from_cache(cached, offset)
            self._reading_in(segment)
            record = segment_reads.read_next(segment, offset) or segment_reads.read_from(
                segment, offset, partial(self._damaged, segment)
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
                    found += segment_reads.take_after(source, record, end, room)
                else:
                    found += self._cached_after(record, end, room)
            offset = found[-1].offset + 1
        return found

    def read_frames(
        self, offset: int, end: int, max_bytes: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """``frames.read_frames``: a damaged frame on the way raises ``CorruptLogError``."""
        i = max(bisect_right(self._bases, offset) - 1, 0)
        return read_frames(self._segments[i:], offset, end, max_bytes, self._damaged)

    def _cached_after(self, record: Record, end: int, limit: int) -> list[Record]:
        """``segment_reads.take_after`` for a record the cache gave (its frame the newest
        kept)."""
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
                self._directory.path,
                segment.log_path.name,
                exc,
            )
        raise CorruptLogError(errno.EIO, self.failure)

    def check_failed(self) -> None:
        """Raise ``CorruptLogError`` if the log is failed (a read met damage before)."""
        if self.failure is not None:
            raise CorruptLogError(errno.EIO, self.failure)

    def records(self, start: int) -> Iterator[Record]:
        """The intact records from offset ``start`` to the end of the log, in order (read from
        the segments, not the cache; damaged records are stepped over without a report)."""
        i = max(bisect_right(self._bases, start) - 1, 0)
        for segment in self._segments[i:]:
            yield from segment_reads.records(segment, start)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose timestamp is >= ``timestamp_ms`` (the log end if none); with
        ``strict``, a damaged frame on the way raises ``CorruptLogError``."""
        for segment in self._segments:
            on_damage = partial(self._damaged, segment) if self.strict else None
            found = segment_reads.offset_for_timestamp(segment, timestamp_ms, on_damage)
            if found is not None:
                return found
        return self._segments[-1].next_offset
