"""The columnar bulk read of a topic partition (``GET /topics/{t}/partitions/{p}/records``,
which the Spark data source fetches): records from an offset as a ``recordbatch.ReadBatch``'s
body.

Responsibilities:
- walk the partition's log from an offset to an end (at most the durable end: nothing a crash
  could take back), within a byte and a record budget;
- collect the columns with as little work a record as the storage allows (the keys and
  values as they lie in the log's frames, no message built, copied once, into the body),
  giving way to other clients every slice.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Iterator, Sequence

import trio.lowlevel

from ...backends.streams import StreamRecord
from ...recordbatch import encode_headers, encode_read_parts
from ..pacing import SLICE_SECONDS
from ..vhost import VirtualHost
from .queue import StreamQueue
from .topics import MAX_READ_BYTES, InvalidRequest, NotFound, partition, stored_headers

MAX_BATCH_RECORDS = 50_000
# Records taken from the log per call.
READ_MANY = 1024


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
    if not 1 <= max_bytes <= MAX_READ_BYTES:
        raise InvalidRequest(f"max_bytes must be between 1 and {MAX_READ_BYTES} (got {max_bytes})")
    queue = partition(vhost, topic, partition_index)
    stream = queue.stream
    high_watermark = stream.durable_end  # nothing a crash could take back
    stop = high_watermark if end is None else min(end, high_watermark)
    columns = _Columns(headers)
    position = max(offset, stream.first_offset)
    while position < stop and columns.size < max_bytes and len(columns) < MAX_BATCH_RECORDS:
        position = columns.take(_records(queue, position, stop), stop, max_bytes)
        if position < stop and columns.size < max_bytes and len(columns) < MAX_BATCH_RECORDS:
            await trio.lowlevel.checkpoint()
            try:
                if partition(vhost, topic, partition_index) is not queue:
                    break
            except NotFound:
                break
            if stream.first_offset > position:  # retention came by: the reader's next fetch
                break  # starts here, and finds (and reports) the gap at its start
    return columns.body(max(position, offset))


def _records(queue: StreamQueue, position: int, end: int) -> Iterator[StreamRecord]:
    """The records from ``position`` on, in order, below ``end``, taken from the log
    in bulk (``StreamLog.read_many``: a record batch is decoded once; damaged records are
    reported and stepped over as every other read does)."""
    stream = queue.stream
    while position < end:
        records = stream.read_many(position, end, READ_MANY)
        if not records:
            return
        yield from records
        position = records[-1].offset + 1


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

    def take(self, records: Iterator[StreamRecord], stop: int, max_bytes: int) -> int:
        """Add records below ``stop`` until ``max_bytes``, ``MAX_BATCH_RECORDS`` or a slice of
        ``SLICE_SECONDS``; return the offset to go on from."""
        add_offset, add_timestamp = self.offsets.append, self.timestamps.append
        add_key, add_value = self.keys.append, self.values.append
        headers = self.headers
        size, room = self.size, MAX_BATCH_RECORDS - len(self.offsets)
        deadline = time.perf_counter() + SLICE_SECONDS
        for count, record in enumerate(records, 1):
            at = record.offset
            if at >= stop:
                break
            add_offset(at)
            add_timestamp(record.timestamp_ms)
            key, value = record.key_and_value
            add_key(key)
            add_value(value)
            if headers is not None:
                headers.append(encode_headers(stored_headers(record.message)))
            size += len(key) + len(value)
            if (
                size >= max_bytes
                or count >= room
                or (not count & 255 and time.perf_counter() >= deadline)
            ):
                self.size = size
                return at + 1
        self.size = size
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
