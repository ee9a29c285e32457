"""Reading a topic's partition record by record (the JSON read of the HTTP API): from an offset
or the first record at or after a timestamp, up to a count and a size, never past the high
watermark (the durable end of the log)."""

from __future__ import annotations

from ..vhost import VirtualHost
from .topics import (
    MAX_READ,
    MAX_READ_BYTES,
    ConsumerRecord,
    InvalidRequest,
    partition,
    stored_headers,
)


def read(
    vhost: VirtualHost,
    topic: str,
    partition_index: int,
    *,
    offset: int | None = None,
    timestamp_ms: int | None = None,
    limit: int = 100,
    max_bytes: int = 1024 * 1024,
) -> list[ConsumerRecord]:
    """Up to ``limit`` records of a partition from ``offset`` (clamped to what is there) or
    from the first record at or after ``timestamp_ms``; from the earliest by default. Stops
    once the values add up to ``max_bytes`` (at least one record is returned)."""
    if not 1 <= limit <= MAX_READ:
        raise InvalidRequest(f"limit must be between 1 and {MAX_READ} (got {limit})")
    if not 1 <= max_bytes <= MAX_READ_BYTES:
        raise InvalidRequest(f"max_bytes must be between 1 and {MAX_READ_BYTES} (got {max_bytes})")
    found = partition(vhost, topic, partition_index).partition
    if timestamp_ms is not None:
        position = found.offset_for_timestamp(timestamp_ms)
    else:
        position = max(offset if offset is not None else 0, found.log_start_offset)
    records: list[ConsumerRecord] = []
    size = 0
    while len(records) < limit and size < max_bytes:
        record = found.read_from(position)  # below the high watermark
        if record is None:
            break
        message = record.message
        records.append(
            ConsumerRecord(
                partition_index,
                record.offset,
                message.timestamp_ms,
                message.routing_key,
                stored_headers(message),
                message.body,
            )
        )
        position = record.offset + 1
        size += len(message.body)
    return records
