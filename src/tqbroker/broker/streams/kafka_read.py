"""A Kafka Fetch's records of one partition, as Kafka's record batches.

The log's frames (``Partition.read_frames``, each CRC-checked) are walked from the one that
holds the fetch offset: a Kafka producer's batch (format 3) is sent as it is stored, as
produced (compressed or not, its records below the fetch offset left for the client to skip,
as Kafka's broker leaves them); the records of any other frame (AMQP publishes, HTTP writes,
compacted segments) are encoded into a batch of their own. Kafka's size rules: the first
batch is sent whole even when it is over the budget (KIP-74, so that a consumer always moves
on); after it, batches while they fit, then the start of the next one up to the budget (a
trailing partial batch, which clients drop and fetch again, as Kafka's ``FileRecords.slice``
sends it).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from ...backends.log.format import kafka_batch_of, parse_frame
from ...backends.streams import StreamRecord
from ...protocol.kafka.records import Header, Record, RecordBatch, encode_batch
from .partition import Partition
from .topics import stored_headers

# A Kafka batch's last offset delta: after base offset i64, length i32, leader epoch i32,
# magic i8, crc u32, attributes i16.
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23


def read_batches(
    partition: Partition, offset: int, max_bytes: int, *, whole_first: bool = True
) -> bytes:
    """The records from ``offset`` on, below the high watermark, as record batches of at most
    ``max_bytes`` in all (but the first, sent whole with ``whole_first``)."""
    end = partition.high_watermark
    if offset >= end:
        return b""
    frames, _resume = partition.read_frames(offset, end, max(max_bytes, 1))
    taken: list[bytes | memoryview] = []
    used = 0
    for head, rest in frames:
        stored = kafka_batch_of(rest)
        if stored is not None:
            (last_delta,) = _LAST_OFFSET_DELTA.unpack_from(stored, _LAST_OFFSET_DELTA_AT)
            first = int.from_bytes(stored[:8], "big", signed=True)
            if first + last_delta >= end:
                break  # not all below the high watermark (a batch is sent whole or not)
            batch: bytes | memoryview = stored
        else:
            records = [r for r in parse_frame(head + rest).records if offset <= r.offset < end]
            if not records:
                continue
            batch = encode_records(records)
        if (taken or not whole_first) and used + len(batch) > max_bytes:
            if used < max_bytes:
                taken.append(batch[: max_bytes - used])  # a trailing partial batch
            break
        taken.append(batch)
        used += len(batch)
    return b"".join(taken)


def encode_records(records: Sequence[StreamRecord]) -> bytes:
    """Stored records (in offset order, maybe with gaps between them: compaction's) as one
    Kafka batch."""
    base, base_timestamp = records[0].offset, records[0].timestamp_ms
    entries = []
    for record in records:
        message = record.message
        entries.append(
            Record(
                record.offset - base,
                record.timestamp_ms - base_timestamp,
                message.routing_key.encode() if message.routing_key else None,
                message.body,
                tuple(kafka_headers(stored_headers(message))),
            )
        )
    max_timestamp = max(record.timestamp_ms for record in records)
    return encode_batch(RecordBatch(base, tuple(entries), base_timestamp, max_timestamp))


def kafka_headers(table: Mapping[str, Any]) -> list[Header]:
    """An AMQP headers table as Kafka headers: a byte string as it is, text in UTF-8, another
    value as its text."""
    made = []
    for name, value in table.items():
        if value is None or isinstance(value, bytes):
            made.append(Header(name, value))
        elif isinstance(value, str):
            made.append(Header(name, value.encode()))
        else:
            made.append(Header(name, str(value).encode()))
    return made
