"""Recovery of a log segment at start (Kafka's LogLoader role, per segment).

Responsibilities:
- ``load_segment``: trust the files of a segment a clean shutdown or a recovery point vouches
  for, but check every index entry against the record header it points at and walk the records
  after the last entry; rescan when anything looks wrong;
- ``scan_segment``: validate every frame (record or record batch) from the start and rebuild
  both indexes, truncating the torn tail at the first bad length or CRC (or, in a trusted
  segment, stepping over a damaged frame).

Which segments are loaded and which scanned, and what happens to the ones after a truncated
segment, is ``Log.open``'s business.
"""

from __future__ import annotations

import logging

from .format import FIXED_SIZE, HEAD_SIZE, RECORD_FIXED, RecordError
from .segment import Segment

log = logging.getLogger(__name__)


def load_segment(segment: Segment, end_offset: int | None = None) -> None:
    """Trust the files (clean shutdown): size from the file, indexes from their files;
    rebuild the indexes if they look wrong. ``end_offset``: the segment is sealed and holds
    the offsets below it (the next segment's base)."""
    size = segment.adopt_file()
    if not (
        segment.offset_index.load(value_limit=size)
        and segment.time_index.load()
        and _indexes_agree(segment)
        and _tail_consistent(segment)
    ):
        scan_segment(segment, truncate=False, end_offset=end_offset)


def _indexes_agree(segment: Segment) -> bool:
    """Every offset-index entry points at the header of the record it names; every time-index
    entry goes with an offset-index entry (they are written together, the first record always
    getting both) and holds at least that record's timestamp (the greatest timestamp so far)."""
    index, times = segment.offset_index, segment.time_index
    if not index.keys or not times.keys:
        return not index.keys and not times.keys
    base = segment.base_offset
    positions = dict(zip(index.keys, index.values, strict=True))
    with segment.map_records() as view:
        for relative, position in positions.items():
            if position + HEAD_SIZE + FIXED_SIZE > segment.size:
                return False
            offset, _stamp, _flags = RECORD_FIXED.unpack_from(view, position + HEAD_SIZE)
            if offset != base + relative:
                return False
        for stamp, relative in zip(times.keys, times.values, strict=True):
            at = positions.get(relative)
            if at is None or RECORD_FIXED.unpack_from(view, at + HEAD_SIZE)[1] > stamp:
                return False
    return True


def _tail_consistent(segment: Segment) -> bool:
    """Walk from the last index entry to the end: every record valid, ending exactly at the
    file size. Sets the segment's next offset and greatest timestamp."""
    index = segment.offset_index
    if segment.size == 0:
        return not index.keys
    if not index.keys:
        return False
    pos = index.values[-1]
    expected = segment.base_offset + index.keys[-1]
    max_timestamp = segment.max_timestamp
    try:
        while pos < segment.size:
            frame = segment.read_at(pos)
            if frame.offset < expected:
                return False
            max_timestamp = max(max_timestamp, frame.timestamp_ms)
            expected = frame.last_offset + 1
            pos += frame.size
    except RecordError:
        return False
    if segment.time_index.keys:
        max_timestamp = max(max_timestamp, segment.time_index.keys[-1])
    segment.resume(expected, max_timestamp)
    return pos == segment.size


def scan_segment(segment: Segment, *, truncate: bool = True, end_offset: int | None = None) -> bool:
    """Validate every record from the start and rebuild both indexes. At the first invalid
    record, ``truncate`` cuts the file there (a torn tail); otherwise (rebuilding the indexes
    of a trusted file) the scan steps over it and goes on. Returns False if any record was
    invalid. ``end_offset`` as for ``load_segment``."""
    file_size = segment.adopt_file()
    segment.reset_indexes()
    pos, expected = 0, segment.base_offset
    intact = True
    while pos < file_size:
        try:
            frame = segment.read_at(pos)
            if frame.offset < expected:
                raise RecordError(f"offset {frame.offset}, expected {expected} or more")
        except RecordError as exc:
            log.warning("%s: invalid record at byte %d (%s)", segment.log_path, pos, exc)
            intact = False
            resume = None if truncate else segment.resync(pos, expected)
            if resume is None:
                break
            log.warning(
                "%s: stepping over it: offset %d follows at byte %d",
                segment.log_path,
                resume[1],
                resume[0],
            )
            pos, expected = resume
            segment.index_next_record()
            continue
        segment.index_record(frame, pos)
        pos += frame.size
        expected = frame.last_offset + 1
    next_offset = expected
    cut = not intact and truncate
    if cut:
        log.warning("%s: truncating the torn tail at byte %d", segment.log_path, pos)
    elif pos < file_size and end_offset is not None:
        # A sealed segment ends with damaged records: keep them (reads report them).
        pos, next_offset = file_size, max(expected, end_offset)
    segment.finish_scan(pos, next_offset, cut=cut)
    return intact
