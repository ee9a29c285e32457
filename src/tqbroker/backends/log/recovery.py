"""Recovery of a log at start (Kafka's LogLoader role).

Responsibilities:
- ``recover_segments`` (for ``Log.open``): a clean-shutdown marker (``CLEAN_MARKER``, which
  ``Log.close`` leaves) means the files are trusted; otherwise every segment from the recovery
  point on is scanned, the torn tail truncated at the first bad record and later segments
  discarded; orphan index files and the leftovers of an unfinished compaction
  (``COMPACTION_DIR``) are removed; a strict log (a stream's) drops an empty last segment that
  would leave a hole at the end of the log;
- ``load_segment``: trust the files of a segment a clean shutdown or a recovery point vouches
  for, but check every index entry against the record header it points at and walk the records
  after the last entry; rescan when anything looks wrong;
- ``scan_segment``: validate every frame (record or record batch) from the start and rebuild
  both indexes, truncating the torn tail at the first bad length or CRC (or, in a trusted
  segment, stepping over a damaged frame).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...storage_env import StorageEnv
from ...storage_env.filecache import Directory
from .compaction import COMPACTION_DIR
from .format import FIXED_SIZE, HEAD_SIZE, RECORD_FIXED, RecordError
from .segment import Segment
from .segment_reads import resync

log = logging.getLogger(__name__)

CLEAN_MARKER = "clean-shutdown"


def recover_segments(
    env: StorageEnv,
    directory: Directory,
    index_interval_bytes: int,
    *,
    recovery_point: int,
    strict: bool,
) -> tuple[list[Segment], bool]:
    """Open (creating if needed) a log's directory and recover its segments: they are
    returned, oldest first, with whether the previous run closed cleanly. Segments at or after
    ``recovery_point`` (the first offset not known to be fsync'd) are scanned when the shutdown
    was not clean. If this raises, the segments it opened are closed."""
    path = directory.path
    env.fs.mkdir(path, parents=True, exist_ok=True)
    marker = path / CLEAN_MARKER
    clean = marker.exists()
    env.fs.rmtree(path / COMPACTION_DIR)
    bases = sorted(int(p.name[:20]) for p in path.glob("*.log") if p.name[:20].isdigit())
    _remove_orphans(env, path, set(bases))
    segments: list[Segment] = []
    try:
        for i, base in enumerate(bases):
            segment = Segment(env.files, directory, base, index_interval_bytes)
            segments.append(segment)  # closed if what follows fails
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            # Trusted: the segments a recovery point passed. One that ends exactly at it may
            # have been the active segment when that checkpoint was written, its indexes not
            # synced yet: rescanned.
            if clean or (next_base is not None and next_base < recovery_point):
                load_segment(segment, next_base)
            elif not scan_segment(segment):
                segment.forget_frame()
                # A segment was truncated: every later segment is unreachable garbage.
                for later in bases[i + 1 :]:
                    log.warning("%s: discarding segment %d after a truncated one", path, later)
                    Segment(env.files, directory, later, index_interval_bytes).delete()
                break
            segment.forget_frame()  # what the load decoded last
        if strict and not clean:
            _drop_empty_tail(path, segments)
        if marker.exists():
            env.fs.unlink(marker)
            env.fsync_dir(path)
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments, clean


def _remove_orphans(env: StorageEnv, path: Path, bases: set[int]) -> None:
    for child in path.iterdir():
        base = child.name[:20]
        orphan = base.isdigit() and int(base) not in bases
        if child.suffix in (".index", ".timeindex") and orphan:
            log.info("removing orphan index file %s", child)
            env.fs.unlink(child)


def _drop_empty_tail(path: Path, segments: list[Segment]) -> None:
    """A crash kept a segment rolled to but not the records buffered in the one before
    (written out after the roll): the empty segment would leave the offsets in between a hole
    that no record fills (a follower fetching from the end would never copy them). It goes,
    and the log ends where its records do (none of those offsets was durable, so no reader saw
    one)."""
    while (
        len(segments) > 1
        and segments[-1].size == 0
        and segments[-2].next_offset < segments[-1].base_offset
    ):
        segment = segments.pop()
        log.warning("%s: removing empty segment %d after a hole", path, segment.base_offset)
        segment.delete()


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
            resume = None if truncate else resync(segment, pos, expected)
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
