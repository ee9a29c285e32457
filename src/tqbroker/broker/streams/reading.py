"""Reading a topic's partition record by record (the JSON read of the HTTP API): from an offset
or the first record at or after a timestamp, up to a count and a size, never past the high
watermark (the durable end of the log).

A read is taken whole (``read``) or a run at a time (``RecordRead``: a body streamed under the
read budget encodes and sends each run before it takes the next); the runs of a read are the
records the whole would be, when the log does not change in between.
"""

from __future__ import annotations

import attrs

from ..vhost import VirtualHost
from .partition import Partition
from .topics import (
    MAX_READ,
    MAX_READ_BYTES,
    ConsumerRecord,
    InvalidRequest,
    failed_log,
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
    return RecordRead(
        vhost,
        topic,
        partition_index,
        offset=offset,
        timestamp_ms=timestamp_ms,
        limit=limit,
        max_bytes=max_bytes,
    ).take()


@attrs.frozen
class _Run:
    """Where a run taken leaves the read: the next position, records and value bytes taken,
    whether the log (or the read's own bounds) ended it, its last offset."""

    position: int
    count: int
    size: int
    ended: bool
    last_offset: int | None


class RecordRead:
    """``read``'s records taken a run at a time: ``take`` a run (again and again: the read
    stands where it was), ``advance`` past it; ``done`` once the read has what it asked for
    or the log has no more. ``last_offset`` is the offset of the last record advanced past."""

    def __init__(
        self,
        vhost: VirtualHost,
        topic: str,
        partition_index: int,
        *,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        limit: int = 100,
        max_bytes: int = 1024 * 1024,
    ) -> None:
        if not 1 <= limit <= MAX_READ:
            raise InvalidRequest(f"limit must be between 1 and {MAX_READ} (got {limit})")
        if not 1 <= max_bytes <= MAX_READ_BYTES:
            raise InvalidRequest(
                f"max_bytes must be between 1 and {MAX_READ_BYTES} (got {max_bytes})"
            )
        self.topic = topic
        self.partition_index = partition_index
        self.partition: Partition = partition(vhost, topic, partition_index).partition
        with failed_log(topic, partition_index):
            if timestamp_ms is not None:
                self.position = self.partition.offset_for_timestamp(timestamp_ms)
            else:
                self.position = max(offset if offset is not None else 0, self.log_start)
        self.left = limit
        self.left_bytes = max_bytes
        self.done = False
        self.last_offset: int | None = None
        self._run = _Run(self.position, 0, 0, False, None)

    @property
    def log_start(self) -> int:
        return self.partition.log_start_offset

    def take(
        self, max_records: int | None = None, max_bytes: int | None = None
    ) -> list[ConsumerRecord]:
        """The records from where the read stands: at most ``max_records`` (and what the read
        has left), stopping once their values add up to ``max_bytes`` (and what it has left;
        at least one record is taken). ``Unavailable`` if the partition's log failed."""
        limit = self.left if max_records is None else min(max_records, self.left)
        budget = self.left_bytes if max_bytes is None else min(max_bytes, self.left_bytes)
        found, index = self.partition, self.partition_index
        records: list[ConsumerRecord] = []
        position, size, ended = self.position, 0, False
        with failed_log(self.topic, index):
            while len(records) < limit and size < budget:
                record = found.read_from(position)  # below the high watermark
                if record is None:
                    ended = True
                    break
                message = record.message
                records.append(
                    ConsumerRecord(
                        index,
                        record.offset,
                        message.timestamp_ms,
                        message.routing_key,
                        stored_headers(message),
                        message.body,
                    )
                )
                position = record.offset + 1
                size += len(message.body)
        ended = ended or len(records) >= self.left or size >= self.left_bytes
        last = records[-1].offset if records else None
        self._run = _Run(position, len(records), size, ended, last)
        return records

    @property
    def run_ends_read(self) -> bool:
        """Whether the run taken last ends the read (past it, the read is ``done``)."""
        return self._run.ended

    def advance(self) -> None:
        """Move past the run taken last."""
        run = self._run
        self.position = run.position
        self.left -= run.count
        self.left_bytes -= run.size
        if run.last_offset is not None:
            self.last_offset = run.last_offset
        self.done = run.ended
        self._run = _Run(self.position, 0, 0, run.ended, None)
