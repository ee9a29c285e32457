"""The ``tqbroker`` source, batch and streaming.

Responsibilities:
- ``BatchReader``: resolve the offset options once, on the driver, into ranges per partition
  (cut into Spark input partitions), which executors read;
- ``StreamReader``: offsets per partition as JSON (``{"topic": {"0": 42}}``, what Spark stores in
  its checkpoint: a restarted query resumes exactly there); ``latestOffset(start, limit)`` with
  ``maxOffsetsPerTrigger`` split in proportion to the partitions' backlogs, capped at the
  target of ``Trigger.AvailableNow``; new partitions start at their earliest offset;
- ``read_range`` (executors): fetch a range in bulk, a ``pyarrow.RecordBatch`` per response,
  and tell lost offsets (retention) from compacted ones (``failOnDataLoss``).

Where each part runs: Spark builds readers in short-lived Python workers on the driver,
pickles them to executors for ``read``, and runs the streaming reader's offset methods in one
long-lived driver-side process; so everything ``read`` needs travels in the reader's options and
in the ``TopicRange`` partition, and the HTTP clients are per process (``client_for``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ._arrow_read import decode_fetch, fetch_head, read_schema
from ._client import client_for
from ._offsets import (
    Offsets,
    Range,
    from_json,
    ranges,
    rate_limit,
    report_data_loss,
    resolve,
    split,
    subscribed,
    to_json,
)
from ._options import OptionError, SourceOptions


@dataclass
class TopicRange(InputPartition):
    """One Spark input partition: offsets ``[start, end)`` of one partition of a topic."""

    topic: str
    partition: int
    start: int
    end: int


def check_schema(schema: StructType, include_headers: bool) -> None:
    """The source produces Spark's Kafka schema; a user-given schema must be that one."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if not to_arrow_schema(schema, timezone="UTC").equals(read_schema(include_headers)):
        raise OptionError(
            "the tqbroker source has a fixed schema (Spark's Kafka schema: key, value, topic, "
            "partition, offset, timestamp, timestampType, and headers with "
            f"includeHeaders=true); drop .schema(...) (got {schema.simpleString()})"
        )


def _partitions(found: Sequence[Range], options: SourceOptions) -> list[TopicRange]:
    pieces = split(
        found,
        min_partitions=options.min_partitions,
        max_records=options.max_records_per_partition,
    )
    return [TopicRange(*piece) for piece in pieces]


class BatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        client = client_for(options.connection)
        infos = subscribed(client, options)
        start = resolve(options.starting, infos, client, strategy=options.timestamp_strategy)
        assert options.ending is not None
        end = resolve(options.ending, infos, client, ending=True)
        for (topic, partition), offset in end.items():
            if offset > infos[topic, partition].latest:
                raise OptionError(
                    f"option '{options.ending.option}': offset {offset} of {topic}/{partition} "
                    f"is past the partition's end ({infos[topic, partition].latest})"
                )
            if start[topic, partition] > offset:
                raise OptionError(
                    f"{topic}/{partition} would start at {start[topic, partition]} (option "
                    f"'{options.starting.option}'), after it ends at {offset} (option "
                    f"'{options.ending.option}')"
                )
        found = ranges(start, end, infos, fail_on_data_loss=options.fail_on_data_loss)
        return _partitions(found, options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: Offsets | None = None  # Trigger.AvailableNow: read no further
        self._latest: dict[str, dict[str, int]] | None = None

    def initialOffset(self) -> dict[str, Any]:
        options = self.options
        client = client_for(options.connection)
        infos = subscribed(client, options)
        return to_json(
            resolve(options.starting, infos, client, strategy=options.timestamp_strategy)
        )

    def prepareForTriggerAvailableNow(self) -> None:
        infos = subscribed(client_for(self.options.connection), self.options)
        self._target = {tp: info.latest for tp, info in infos.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        options = self.options
        infos = subscribed(client_for(options.connection), options)
        latest = {tp: info.latest for tp, info in infos.items()}
        self._latest = to_json(latest)
        if self._target is not None:  # partitions found after the target are not read
            latest = {
                tp: min(o, self._target[tp]) for tp, o in latest.items() if tp in self._target
            }
        begin = from_json(start)
        for tp in list(begin):
            if tp not in infos and not options.fail_on_data_loss:
                del begin[tp]  # gone, and reported when the batch is planned
        for tp, info in infos.items():
            if tp in latest and tp not in begin:
                begin[tp] = info.earliest  # a new partition: from its start
            elif tp in begin and not options.fail_on_data_loss:
                begin[tp] = max(begin[tp], info.earliest)
        ahead = {tp: max(latest.get(tp, begin[tp]), begin[tp]) for tp in begin}
        end = rate_limit(begin, ahead, limit.max_rows) if isinstance(limit, ReadMaxRows) else ahead
        for tp, offset in latest.items():  # a log that went back: planning reports it
            if offset < begin.get(tp, offset):
                end[tp] = offset
        return to_json(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        options = self.options
        begin, stop = from_json(start), from_json(end)
        if begin == stop:
            return []
        infos = subscribed(client_for(options.connection), options)
        found = ranges(begin, stop, infos, fail_on_data_loss=options.fail_on_data_loss)
        for tp, offset in begin.items():  # offsets past the end: the log went back
            if tp in stop and offset > stop[tp]:
                report_data_loss(
                    f"{tp[0]}/{tp[1]} ends at {stop[tp]}, before offset {offset} that was "
                    "read (was the topic deleted and declared again?)",
                    options.fail_on_data_loss,
                )
        return _partitions(found, options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark's checkpoint is the only record of progress: nothing to tell the broker."""

    def stop(self) -> None:
        client_for(self.options.connection).close()


def read_range(
    options: SourceOptions, part: InputPartition
) -> Generator[pa.RecordBatch, None, None]:
    """Batches of ``part``'s records, fetched in bulk (``fetchMaxBytes`` a request). The next
    request goes out (on the fetch thread) as soon as a response's head says where it ends,
    so the broker prepares it while this one is decoded and Spark takes it."""
    if not isinstance(part, TopicRange):  # Spark's stand-in when there is nothing to read
        return
    position = part.start
    pending: Future[bytes] | None = _fetcher().submit(_fetch, options, part, position)
    try:
        while pending is not None:
            body = pending.result()
            ahead = _next_fetch(body, part.end)
            pending = None if ahead is None else _fetcher().submit(_fetch, options, part, ahead)
            fetched = decode_fetch(
                body,
                part.topic,
                part.partition,
                include_headers=options.include_headers,
                start=position,
                end=part.end,
            )
            if not len(fetched) and position < fetched.next_offset < part.end:
                position = fetched.next_offset  # frames whose records all lie below it
            else:
                if not len(fetched) or fetched.offsets[0] > position:
                    _check_gap(options, part, position, found=len(fetched) > 0)
                if not len(fetched):
                    return
                yield fetched.batch
                position = max(fetched.next_offset, int(fetched.offsets[-1]) + 1)
                if position >= part.end:
                    return
            if pending is None or ahead != position:  # not with a sound broker
                if pending is not None:
                    pending.cancel()
                pending = _fetcher().submit(_fetch, options, part, position)
    finally:
        if pending is not None:  # stopped early (an error, or Spark needs no more)
            pending.cancel()


_fetch_pool: ThreadPoolExecutor | None = None


def _fetcher() -> ThreadPoolExecutor:
    """The process's fetch thread (one task runs in a Python worker at a time; its client,
    thread-local, keeps its connection between tasks)."""
    global _fetch_pool
    if _fetch_pool is None:
        _fetch_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tqbroker-fetch")
    return _fetch_pool


def _fetch(options: SourceOptions, part: TopicRange, position: int) -> bytes:
    return client_for(options.connection).fetch(
        part.topic,
        part.partition,
        position,
        part.end,
        options.fetch_max_bytes,
        options.include_headers,
    )


def _next_fetch(body: bytes, end: int) -> int | None:
    """Where the request after ``body`` starts, from its head alone; None if there is none
    (an empty or malformed body: decoding it tells which)."""
    head = fetch_head(body)
    if head is None or head[0] == 0 or head[1] >= end:
        return None
    return head[1]


def _check_gap(options: SourceOptions, part: TopicRange, position: int, *, found: bool) -> None:
    """Records from ``position`` are missing: compaction (fine) or retention (data loss)?"""
    infos = {i.partition: i for i in client_for(options.connection).partitions(part.topic)}
    info = infos.get(part.partition)
    if info is None:
        report_data_loss(
            f"partition {part.topic}/{part.partition} is gone", options.fail_on_data_loss
        )
    elif info.earliest > position:
        report_data_loss(
            f"offsets {position} to {min(info.earliest, part.end) - 1} of "
            f"{part.topic}/{part.partition} are gone (retention removed them while the query "
            f"ran: the partition starts at {info.earliest} now)",
            options.fail_on_data_loss,
        )
    elif not found and info.latest < part.end:
        report_data_loss(
            f"{part.topic}/{part.partition} ends at {info.latest}, before offset {part.end} "
            "that was to be read (was the topic deleted and declared again?)",
            options.fail_on_data_loss,
        )
