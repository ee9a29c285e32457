"""Frames as they lie in a log, for bulk readers that decode the records themselves (the HTTP
topic API's ``TQF1`` body, which the Spark data source fetches): each frame's CRC is checked,
no record is decoded, nothing is re-encoded.

Responsibilities:
- find the frames that hold the records from an offset on, below an end, within a byte budget
  (at least one frame): first the frame that holds the offset, whose records below it are the
  reader's to skip (as are those at or past the end in the last frame), then whole frames;
- strict: a damaged frame on the way is reported to the log (which fails the stream and
  raises ``CorruptLogError``) and is never stepped over;
- say where the next read starts: the first offset of the first frame not taken.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from functools import partial

import google_crc32c

from .format import FLAG_BATCH, HEAD_SIZE, MAX_RECORD, MIN_RECORD, RecordError
from .segment import Segment

# A frame's start: length, crc, (first) offset, timestamp_ms, flags.
FRAME_START = struct.Struct(">IIQQB")
# How much of a segment one read takes, at least (a frame bigger than that is read whole).
READ_CHUNK = 256 * 1024
_crc = google_crc32c.value


class FrameRead:
    """The frames taken so far by one read, as ``(head, rest)`` pairs: the 8 bytes of length
    and CRC, and the bytes the CRC covers (the frame is their concatenation)."""

    def __init__(self, max_bytes: int) -> None:
        self.frames: list[tuple[bytes, bytes]] = []
        self.size = 0
        self.max_bytes = max_bytes

    def add(self, head: bytes, rest: bytes) -> None:
        self.frames.append((head, rest))
        self.size += len(head) + len(rest)

    def drop_last(self) -> None:
        head, rest = self.frames.pop()
        self.size -= len(head) + len(rest)

    def take(
        self,
        segment: Segment,
        offset: int,
        end: int,
        on_damage: Callable[[RecordError], None],
    ) -> int | None:
        """Add the frames of ``segment`` that hold records from ``offset`` on, below ``end``,
        until the budget is spent; return the first offset of the first frame not taken, or
        None when the segment ended first (the read goes on in the next one). A damaged frame
        on the way goes to ``on_damage``, then raises ``RecordError``: never stepped over."""
        pos, least = segment.position_at_or_before(offset)
        chunk, chunk_at = b"", pos
        holds_offset = False  # the last frame added starts at or below ``offset``
        size = segment.size
        first: int
        while pos < size:
            at = pos - chunk_at
            if at + FRAME_START.size > len(chunk):
                chunk, chunk_at, at = segment.raw(pos, max(READ_CHUNK, self.left)), pos, 0
            try:
                length, crc, first, _timestamp, flags = FRAME_START.unpack_from(chunk, at)
                if not MIN_RECORD - 4 <= length <= MAX_RECORD:
                    raise RecordError(f"impossible record length {length}")
                if at + 4 + length > len(chunk):
                    chunk, chunk_at, at = segment.raw(pos, max(4 + length, self.left)), pos, 0
                    if 4 + length > len(chunk):
                        raise RecordError("the frame is cut short")
                rest = chunk[at + HEAD_SIZE : at + 4 + length]
                if _crc(rest) != crc:
                    raise RecordError("CRC-32C mismatch")
                if first < least:
                    raise RecordError(f"offset {first} where {least} or more belongs")
            except (RecordError, struct.error) as exc:
                damage = RecordError(f"byte {pos}: {exc}")
                on_damage(damage)
                raise damage from None
            if first >= end:
                return first
            batch = bool(flags & FLAG_BATCH)
            if first <= offset:
                if holds_offset:  # the frame before ends below this one: below ``offset``
                    self.drop_last()
                    holds_offset = False
                if first == offset or batch:
                    self.add(chunk[at : at + HEAD_SIZE], rest)
                    holds_offset = batch
            elif self.size >= self.max_bytes:
                return first
            else:
                self.add(chunk[at : at + HEAD_SIZE], rest)
                holds_offset = False
            pos, least = pos + 4 + length, first + 1
        return None

    @property
    def left(self) -> int:
        return max(self.max_bytes - self.size, 0)


def read_frames(
    segments: Sequence[Segment],
    offset: int,
    end: int,
    max_bytes: int,
    on_damage: Callable[[Segment, RecordError], None],
) -> tuple[list[tuple[bytes, bytes]], int]:
    """The frames of ``segments`` (from the one that holds ``offset``, in order) that hold
    the records from ``offset`` on, below ``end``, about ``max_bytes`` of them (at least one
    frame when there is one), and the offset the next read starts at (``end`` when nothing
    is left below it)."""
    read = FrameRead(max_bytes)
    for segment in segments:
        if segment.next_offset <= offset:
            continue
        if segment.base_offset >= end:
            break
        resume = read.take(segment, offset, end, partial(on_damage, segment))
        if resume is not None:
            return read.frames, resume
    return read.frames, end
