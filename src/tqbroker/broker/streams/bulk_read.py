"""The bulk read of a topic partition (``GET /topics/{t}/partitions/{p}/records``): records
from an offset as a ``recordbatch.ReadBatch``'s columns (``TQR1``), or as the log's frames
(``TQF1``, which the Spark data source fetches).

Responsibilities:
- walk the partition's log from an offset to an end (at most the durable end: nothing a crash
  could take back), within a byte and a record budget;
- collect the columns with as little work a record as the storage allows (the keys and
  values as they lie in the log's frames, no message built, copied once, into the body),
  giving way to other clients every slice; the body is built whole (every key comes before
  the first value), under a reservation of the read budget (``columns_estimate``);
- or stream the frames as they lie on disk (``StreamLog.read_frames``: nothing decoded or
  re-encoded, each frame's CRC checked): ``plan_frames`` walks them a chunk at a time between
  slices, keeping only where each chunk lies; the body (``FramesPlan.pieces``) reads each chunk
  again as it is sent, one at a time under the read budget, and checks it is the chunk
  planned (its frames' lengths and CRCs), else cuts the response short (``ReadCut``).
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from itertools import accumulate, chain
from operator import add, attrgetter
from typing import Self

import attrs
import trio.lowlevel

from ...recordbatch import encode_headers, encode_read_parts, frames_head
from ..pacing import SLICE_SECONDS
from ..read_budget import Piece, ReadCut
from ..vhost import VirtualHost
from .partition import Partition
from .queue import StreamQueue
from .topics import MAX_READ_BYTES, InvalidRequest, NotFound, partition, stored_headers

MAX_BATCH_RECORDS = 50_000
# Records taken from the log per call (the clock is looked at after each).
READ_MANY = 256
_OFFSET = attrgetter("offset")
_TIMESTAMP = attrgetter("timestamp_ms")
_KEY_AND_VALUE = attrgetter("key_and_value")
# The frames taken between two looks at the clock, in bytes: a piece of a streamed body.
FRAMES_CHUNK = 1024 * 1024
# A body's head (either format): magic, count, next offset.
HEAD_BYTES = len(frames_head(0, 0))


async def read_body(
    vhost: VirtualHost,
    topic: str,
    partition_index: int,
    *,
    offset: int,
    end: int | None,
    max_bytes: int,
    headers: bool,
) -> bytes:
    """The ``TQR1`` body of a ``ReadBatch``: the records of a partition from ``offset``
    (clamped to what is there) up to ``end`` (exclusive; None: the log end), stopping once
    keys and values add up to ``max_bytes`` (at least one record when there is one) or at
    ``MAX_BATCH_RECORDS`` records.
    Gives way to other clients every ``SLICE_SECONDS`` of work (the pacer's), and then stops
    early if the partition went away meanwhile (deleted: the next read says so) or retention
    removed the records that come next (the reader then sees that gap at the start of its
    next batch, where it checks for data loss)."""
    queue, stop = _range(vhost, topic, partition_index, end, max_bytes)
    found = queue.partition
    columns = _Columns(headers)
    position = max(offset, found.log_start_offset)
    while position < stop and columns.size < max_bytes and len(columns) < MAX_BATCH_RECORDS:
        position = columns.take(found, position, stop, max_bytes)
        if position < stop and columns.size < max_bytes and len(columns) < MAX_BATCH_RECORDS:
            await trio.lowlevel.checkpoint()
            if not _still_there(vhost, topic, partition_index, queue):
                break
            if found.log_start_offset > position:  # retention came by: the reader's next fetch
                break  # starts here, and finds (and reports) the gap at its start
    return columns.body(max(position, offset))


async def plan_frames(
    vhost: VirtualHost,
    topic: str,
    partition_index: int,
    *,
    offset: int,
    end: int | None,
    max_bytes: int,
) -> FramesPlan:
    """Where the ``TQF1`` body of the same read as ``read_body`` lies: the frames that hold the
    records of ``[offset, end)`` as they lie in the log, about ``max_bytes`` of them (at least
    one frame when there is a record); the reader skips the records outside its range. Walked
    ``FRAMES_CHUNK`` bytes at a time, giving way to other clients between chunks (and then
    stopping early, as ``read_body`` does, if the partition went away or retention came); each
    chunk is read (its CRCs checked) and let go at once: the body reads it again when it is sent
    (``FramesPlan.pieces``), so that a read holds one chunk at a time, not its whole body."""
    queue, stop = _range(vhost, topic, partition_index, end, max_bytes)
    found = queue.partition
    chunks: list[_FramesChunk] = []
    size = 0
    position = max(offset, found.log_start_offset)
    while position < stop and size < max_bytes:
        room = min(max_bytes - size, FRAMES_CHUNK)
        taken, after = found.read_frames(position, stop, room)
        got = bool(taken)
        if got:
            chunk = _FramesChunk.of(position, room, taken, after)
            chunks.append(chunk)
            size += chunk.size
        del taken  # read again when sent
        position = after
        if not got or position >= stop or size >= max_bytes:
            break
        await trio.lowlevel.checkpoint()
        if (
            not _still_there(vhost, topic, partition_index, queue)
            or found.log_start_offset > position
        ):
            break
    return FramesPlan(vhost, topic, partition_index, queue, stop, chunks, max(position, offset))


@attrs.frozen
class _FramesChunk:
    """Frames taken at once by ``Partition.read_frames(start, stop, room)``: how many, their
    bytes, where the next read starts, and a digest of their heads (lengths and CRCs: a chunk
    read again gives the same frames, or the log changed under the read)."""

    start: int
    room: int
    count: int
    size: int
    resume: int
    heads: int

    @classmethod
    def of(cls, start: int, room: int, frames: list[tuple[bytes, bytes]], resume: int) -> Self:
        size = sum(len(head) + len(rest) for head, rest in frames)
        return cls(start, room, len(frames), size, resume, _digest(frames))


def _digest(frames: list[tuple[bytes, bytes]]) -> int:
    return hash(b"".join(head for head, _rest in frames))


@attrs.frozen
class FramesPlan:
    """A ``TQF1`` body planned (``plan_frames``): its length and its pieces."""

    vhost: VirtualHost
    topic: str
    partition_index: int
    queue: StreamQueue
    stop: int
    chunks: list[_FramesChunk]
    next_offset: int

    @property
    def length(self) -> int:
        return HEAD_BYTES + sum(chunk.size for chunk in self.chunks)

    def pieces(self) -> Iterator[Piece]:
        """The head, then each chunk of frames (the head goes with the first): each piece
        reads its frames from the log again when it is built and checks they are the ones
        planned (``ReadCut`` if the partition went away or its log changed)."""
        head = frames_head(sum(chunk.count for chunk in self.chunks), self.next_offset)
        if not self.chunks:
            yield Piece(len(head), partial(_constant, head))
        for i, chunk in enumerate(self.chunks):
            prefix = head if i == 0 else b""
            yield Piece(len(prefix) + chunk.size, partial(self._build, prefix, chunk))

    async def _build(self, prefix: bytes, chunk: _FramesChunk) -> bytes:
        if not _still_there(self.vhost, self.topic, self.partition_index, self.queue):
            raise ReadCut(f"partition {self.partition_index} of topic '{self.topic}' went away")
        frames, resume = self.queue.partition.read_frames(chunk.start, self.stop, chunk.room)
        if _FramesChunk.of(chunk.start, chunk.room, frames, resume) != chunk:
            raise ReadCut(
                f"the log of partition {self.partition_index} of topic '{self.topic}' changed "
                f"under the read (retention or compaction) at offset {chunk.start}"
            )
        return b"".join([prefix, *chain.from_iterable(frames)])


async def _constant(data: bytes) -> bytes:
    return data


def columns_estimate(
    vhost: VirtualHost,
    topic: str,
    partition_index: int,
    *,
    offset: int,
    end: int | None,
    max_bytes: int,
) -> int:
    """What a ``read_body`` is expected to take, to reserve before it is built: ``max_bytes``
    of keys and values (at most what the partition stores), and 24 bytes a record of offsets,
    timestamps and column ends; headers, and a last record past ``max_bytes``, not counted
    (a body that comes out bigger takes the difference, or is built again: ``ReadBody``)."""
    queue, stop = _range(vhost, topic, partition_index, end, max_bytes)  # checks max_bytes
    found = queue.partition
    stored = found.storage_info().bytes
    records = min(max(stop - max(offset, found.log_start_offset), 1), MAX_BATCH_RECORDS)
    data = max_bytes if stored is None else min(max_bytes, stored)
    return HEAD_BYTES + data + 24 * records + 12


def _range(
    vhost: VirtualHost, topic: str, partition_index: int, end: int | None, max_bytes: int
) -> tuple[StreamQueue, int]:
    """A bulk read's partition and where it stops: ``end``, at most the high watermark."""
    if not 1 <= max_bytes <= MAX_READ_BYTES:
        raise InvalidRequest(f"max_bytes must be between 1 and {MAX_READ_BYTES} (got {max_bytes})")
    queue = partition(vhost, topic, partition_index)
    high_watermark = queue.partition.high_watermark  # nothing a crash could take back
    return queue, high_watermark if end is None else min(end, high_watermark)


def _still_there(vhost: VirtualHost, topic: str, partition_index: int, queue: StreamQueue) -> bool:
    try:
        return partition(vhost, topic, partition_index) is queue
    except NotFound:
        return False


class _Columns:
    """A ``ReadBatch`` being filled: keys and values as they lie in the log (views of its
    frames), copied once, into the body."""

    def __init__(self, headers: bool) -> None:
        self.offsets: array[int] = array("q")
        self.timestamps: array[int] = array("q")
        self.keys: list[bytes] = []
        self.values: list[bytes | memoryview] = []
        self.headers: list[bytes] | None = [] if headers else None
        self.size = 0  # keys and values, in bytes

    def __len__(self) -> int:
        return len(self.offsets)

    def take(self, partition: Partition, position: int, stop: int, max_bytes: int) -> int:
        """Add the records from ``position`` on, below ``stop``, until ``max_bytes``,
        ``MAX_BATCH_RECORDS`` or a slice of ``SLICE_SECONDS``; return the offset to go on
        from. The records come from the log in bulk (``StreamLog.read_many``: a record batch is
        decoded once; damaged records are reported and stepped over as every other read does)
        and their columns are collected a chunk at a time."""
        deadline = time.perf_counter() + SLICE_SECONDS
        while position < stop:
            room = MAX_BATCH_RECORDS - len(self.offsets)
            records = partition.read_many(position, min(READ_MANY, room), stop)
            if not records:
                break
            keys, values = zip(*map(_KEY_AND_VALUE, records), strict=True)
            # The running size after each record: the chunk ends at the record that reaches
            # max_bytes (at least one record is taken).
            sizes = list(accumulate(map(add, map(len, keys), map(len, values)), initial=self.size))
            taken = min(bisect_left(sizes, max_bytes, 1), len(records))
            if taken < len(records):
                records, keys, values = records[:taken], keys[:taken], values[:taken]
            self.offsets.extend(map(_OFFSET, records))
            self.timestamps.extend(map(_TIMESTAMP, records))
            self.keys.extend(keys)
            self.values.extend(values)
            if self.headers is not None:
                self.headers.extend(encode_headers(stored_headers(r.message)) for r in records)
            self.size = sizes[taken]
            position = records[-1].offset + 1
            if (
                self.size >= max_bytes
                or len(self.offsets) >= MAX_BATCH_RECORDS
                or time.perf_counter() >= deadline
            ):
                return position
        return stop  # nothing more below it

    def body(self, next_offset: int) -> bytes:
        keys, values = self.keys, self.values
        columns: list[tuple[Iterable[int], Sequence[bytes | memoryview]]] = [
            (map(len, keys), keys),
            (map(len, values), values),
        ]
        if self.headers is not None:
            columns.append((map(len, self.headers), self.headers))
        return encode_read_parts(next_offset, self.offsets, self.timestamps, columns)
