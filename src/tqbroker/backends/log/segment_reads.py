"""Finding records in one segment by offset or timestamp (``segment.py`` holds the frames).

Responsibilities:
- a record by offset, the first intact record at or after an offset, and every intact record
  from an offset on, in order: the offset index gives the last entry at or before the offset,
  then a walk over the frames (those not yet written out are read from the append buffer);
- sequential reads cheaply: where the last walk stopped (``Segment.hint``) and the frame of the
  record read last (``Segment.current``), so reading a batch record by record, or going on
  where the last read stopped, decodes each frame once (``take_after`` takes the rest of a
  batch at once);
- damage: a damaged frame (a flipped bit) yields a ``RecordError`` and the walk goes on at the
  next intact frame (``resync``, which recovery uses too), so only it is lost;
- the first offset at or after a timestamp: the time index, then a walk.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator

from .format import HEAD_SIZE, Record, RecordError, first_at_or_after, records_after
from .segment import Segment

# Past a damaged record, how many offsets ahead the search for the next intact one looks.
RESYNC_RECORDS = 16


def read(segment: Segment, offset: int) -> Record | None:
    """The record with ``offset``, or None if the segment does not hold it. Raises
    ``RecordError`` if that record is damaged; damaged records before it are stepped over."""
    if not segment.base_offset <= offset < segment.next_offset:
        return None
    damaged: list[RecordError] = []
    record = read_from(segment, offset, damaged.append)
    if record is not None and record.offset == offset:
        return record
    if damaged:
        raise damaged[0]
    return None


def read_next(segment: Segment, offset: int) -> Record | None:
    """``read_from`` for a sequential reader, cheaply: the intact record where the last read
    stopped if ``offset`` is where it stopped; None otherwise (or if that record is damaged:
    ``read_from`` then finds it again and reports it)."""
    hint_least, pos = segment.hint
    if offset != hint_least or pos >= segment.size:
        return None
    try:
        frame = segment.read_at(pos)
    except RecordError:
        return None
    records = frame.records
    i = first_at_or_after(frame, offset)
    if i is None:
        return None
    record = records[i]
    segment.hint = (record.offset + 1, pos + frame.size if i == len(records) - 1 else pos)
    segment.current = (frame, pos)
    return record


def take_after(segment: Segment, record: Record, end: int, limit: int) -> list[Record]:
    """The records after ``record`` (the one read last) in its frame, below ``end``, at most
    ``limit``; a sequential read goes on after the last of them."""
    if segment.current is None:
        return []
    frame, pos = segment.current
    taken = records_after(frame, record, end, limit)
    if taken:
        last = taken[-1]
        whole = last is frame.records[-1]
        segment.hint = (last.offset + 1, pos + frame.size if whole else pos)
    return taken


def read_from(
    segment: Segment, offset: int, on_damage: Callable[[RecordError], None]
) -> Record | None:
    """The first intact record at or after ``offset`` (None: none in this segment). A damaged
    record met on the way, after every record below ``offset``, goes to ``on_damage`` and is
    stepped over."""
    record = read_next(segment, offset)
    if record is not None:
        return record
    damage: RecordError | None = None
    for item in _walk_from(segment, offset):
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


def records(segment: Segment, offset: int) -> Iterator[Record]:
    """The intact records from ``offset`` to the end, in order; damaged ones are stepped over
    silently (``read`` is what reports them)."""
    for item in _walk_from(segment, offset):
        if isinstance(item, Record) and item.offset >= offset:
            yield item


def _walk_from(segment: Segment, offset: int) -> Iterator[Record | RecordError]:
    """``walk`` from the last index entry at or before ``offset``, or from where the last walk
    stopped if that is closer (sequential reads then decode each record once)."""
    pos, least = segment.position_at_or_before(offset)
    hint_least, hint_pos = segment.hint
    if least <= hint_least <= offset:
        pos, least = hint_pos, hint_least
    return walk(segment, pos, least)


def walk(segment: Segment, pos: int, least: int) -> Iterator[Record | RecordError]:
    """The records from byte ``pos`` (where a frame with an offset of ``least`` or more starts,
    or the batch that holds ``least``) to the end, the append buffer included. A damaged frame
    (or one whose offsets are not above the one before) yields a ``RecordError`` instead, and
    the walk goes on at the next intact frame (see ``resync``)."""
    while pos < segment.size:
        try:
            frame = segment.read_at(pos)
            if frame.last_offset < least:
                raise RecordError(f"offset {frame.offset} where {least} or more belongs")
        except RecordError as exc:
            yield RecordError(f"byte {pos}: {exc}")
            resume = resync(segment, pos, least)
            if resume is None:
                return
            pos, least = resume
            continue
        end = pos + frame.size
        records = frame.records
        last = len(records) - 1
        for i, record in enumerate(records):
            if record.offset < least:
                continue
            segment.hint = (record.offset + 1, end if i == last else pos)
            segment.current = (frame, pos)
            yield record
        pos, least = end, frame.last_offset + 1


def resync(segment: Segment, pos: int, least: int) -> tuple[int, int] | None:
    """After a damaged record at byte ``pos`` (whose offset is ``least`` or more): the position
    and offset of the next intact record. That is where the damaged record's length says,
    unless the length field is what was damaged: then the next records are searched for by
    their offset field (a match counts only with a valid CRC), the next ``RESYNC_RECORDS``
    offsets up to the next index entry, a known record start (so in a compacted segment, whose
    offsets have gaps, the records up to that entry may be lost); None if the file ends
    first."""
    if pos >= segment.written:
        return None  # the append buffer is never damaged
    positions = segment.offset_index.values
    j = bisect_right(positions, pos)
    limit, limit_offset = segment.entry(j) if j < len(positions) else (segment.written, None)
    end = min(limit, segment.written)
    head = segment.file.pread(4, pos)
    if len(head) == 4:
        candidate = pos + 4 + int.from_bytes(head, "big")
        found = _intact_at(segment, candidate, least + 1) if candidate < end else None
        if found is not None:
            return candidate, found
    last = least + 1 + RESYNC_RECORDS
    if limit_offset is not None:
        last = min(last, limit_offset)
    with segment.file.map(end) as view:
        for offset in range(least + 1, last):
            needle = offset.to_bytes(8, "big")
            at = view.find(needle, pos + 1 + HEAD_SIZE, end)
            while at >= 0:
                if _intact_at(segment, at - HEAD_SIZE, offset) is not None:
                    return at - HEAD_SIZE, offset
                at = view.find(needle, at + 1, end)
    if limit_offset is not None:
        return limit, limit_offset
    return None


def _intact_at(segment: Segment, pos: int, least: int) -> int | None:
    """The offset of the intact record at byte ``pos`` if it is ``least`` or more."""
    try:
        offset = segment.read_at(pos).offset
    except RecordError:
        return None
    return offset if offset >= least else None


def offset_for_timestamp(
    segment: Segment, timestamp_ms: int, on_damage: Callable[[RecordError], None] | None = None
) -> int | None:
    """The first offset whose record has a timestamp >= ``timestamp_ms`` (None: none here).
    Damaged records on the way go to ``on_damage`` if given, and are stepped over."""
    if segment.max_timestamp < timestamp_ms:
        return None
    i = segment.time_index.find(timestamp_ms - 1)
    j = segment.offset_index.find(segment.time_index.values[i]) if i >= 0 else -1
    for item in walk(segment, *segment.entry(j)):
        if isinstance(item, RecordError):
            if on_damage is not None:
                on_damage(item)
        elif item.timestamp_ms >= timestamp_ms:
            return item.offset
    return None
