"""The ``tqbroker`` sink, batch and streaming: Arrow batches in, bulk ``TQW1`` writes out.

Responsibilities:
- ``sink_columns``: Kafka's sink contract — ``value`` (string or binary) required; ``key``
  (string or binary), ``headers`` (``array<struct<key, value>>``) and ``partition`` (int)
  optional; ``topic`` (string) unless the ``topic`` option is set (the option wins);
- ``write_rows`` (executors): rows grouped by topic, cut into requests of about
  ``writeChunkBytes``, sent in order (each waits until the broker made it durable), so a task's
  rows land in their order; keys pick partitions on the broker exactly as AMQP publishes do;
- idempotence: each task writes as producer ``spark:<sink>:<task partition>``, its n-th row of
  a topic with sequence ``(batch id << 32) + n``; the broker skips the rows whose sequence the
  producer already wrote, so a retried task or a micro-batch replayed after a restart writes
  nothing twice however its rows are cut into requests (as long as the replay gives the task
  the same rows in the same order, which a deterministic query over the same offsets does).

The sink of a streaming query is named by the ``sinkId`` option, else by the query's id (kept
in its checkpoint, so it survives restarts, and new for a new checkpoint). A batch job's
producers are new per job: retried tasks are not written twice, a job run again is (at least
once, as Kafka's sink).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from ._arrow_write import encode_write, value_sizes
from ._client import client_for
from ._options import OptionError, SinkOptions

BATCH_SEQUENCE_SHIFT = 32
# A request body stays well under the broker's 64 MiB limit: bigger pieces are halved.
MAX_REQUEST_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class SinkColumns:
    """Where the sink's columns are in the written rows (None: absent)."""

    value: int
    key: int | None = None
    topic: int | None = None
    partition: int | None = None
    headers: int | None = None


@dataclass
class WriteResult(WriterCommitMessage):
    """What a task wrote: records, requests, and requests the broker had already applied."""

    records: int = 0
    requests: int = 0
    duplicates: int = 0
    topics: list[str] = field(default_factory=list)


def sink_columns(schema: StructType, options: SinkOptions) -> SinkColumns:
    """Find and check the sink's columns (``OptionError`` naming the column otherwise)."""
    index = {f.name.lower(): n for n, f in enumerate(schema.fields)}
    types = {f.name.lower(): f.dataType for f in schema.fields}
    text = (StringType, BinaryType)

    def column(name: str, allowed: tuple[type[DataType], ...], what: str) -> int | None:
        if name not in index:
            return None
        if not isinstance(types[name], allowed):
            raise OptionError(
                f"the tqbroker sink's column '{name}' must be {what} "
                f"(got {types[name].simpleString()})"
            )
        return index[name]

    value = column("value", text, "string or binary")
    if value is None:
        raise OptionError(
            "the tqbroker sink needs a 'value' column (string or binary); got columns "
            + ", ".join(f.name for f in schema.fields)
        )
    topic = column("topic", (StringType,), "string")
    if options.topic is not None:
        topic = None  # the option wins, as with Kafka
    elif topic is None:
        raise OptionError("the tqbroker sink needs the 'topic' option or a 'topic' column (string)")
    headers = column("headers", (ArrayType,), "array<struct<key: string, value: binary>>")
    if headers is not None:
        element = types["headers"]
        assert isinstance(element, ArrayType)
        inner = element.elementType
        if not (
            isinstance(inner, StructType)
            and [f.name for f in inner.fields] == ["key", "value"]
            and isinstance(inner.fields[0].dataType, StringType)
            and isinstance(inner.fields[1].dataType, text)
        ):
            raise OptionError(
                "the tqbroker sink's column 'headers' must be "
                f"array<struct<key: string, value: binary>> (got {element.simpleString()})"
            )
    return SinkColumns(
        value=value,
        key=column("key", text, "string or binary"),
        topic=topic,
        partition=column("partition", (IntegerType, ShortType, LongType), "an integer"),
        headers=headers,
    )


def stream_sink_id(options: SinkOptions) -> str | None:
    """The ``sinkId`` option (None: the query's id, known on the executors)."""
    return options.sink_id or None


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns
        self.job = uuid.uuid4().hex  # made on the driver: every task attempt shares it

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        context = TaskContext.get()
        producer = None
        if self.options.idempotent and context is not None:
            producer = f"spark:{self.job}:{context.partitionId()}"
        return write_rows(self.options, self.columns, iterator, producer, 0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every record is durable already: each request returned once it was."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Records written by tasks that finished stay (streams are append-only)."""


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, columns: SinkColumns, sink_id: str | None) -> None:
        self.options = options
        self.columns = columns
        self.sink_id = sink_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        context = TaskContext.get()
        producer, base = None, 0
        if self.options.idempotent and context is not None:
            batch_id = context.getLocalProperty("streaming.sql.batchId")
            sink = self.sink_id or context.getLocalProperty("sql.streaming.queryId")
            if sink and batch_id is not None and batch_id.isdigit():
                producer = f"spark:{sink}:{context.partitionId()}"
                base = int(batch_id) << BATCH_SEQUENCE_SHIFT
        return write_rows(self.options, self.columns, iterator, producer, base)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every record is durable already: each request returned once it was."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a replay of this batch skips what was written (idempotence)."""


def write_rows(
    options: SinkOptions,
    columns: SinkColumns,
    batches: Iterator[pa.RecordBatch],
    producer: str | None,
    sequence_base: int,
) -> WriteResult:
    """Write the rows in order, in requests of about ``options.chunk_bytes``."""
    client = client_for(options.connection)
    result = WriteResult()
    pending: dict[str, list[pa.RecordBatch]] = {}
    pending_bytes: dict[str, int] = {}
    rows_sent: dict[str, int] = {}  # per topic: the sequence of a row is base + its index

    def send(topic: str, piece: pa.RecordBatch) -> None:
        body = encode_write(
            piece.column(columns.value),
            _column(piece, columns.key),
            _column(piece, columns.partition),
            _column(piece, columns.headers),
        )
        if len(body) > MAX_REQUEST_BYTES and piece.num_rows > 1:  # big keys or headers
            half = piece.num_rows // 2
            send(topic, piece.slice(0, half))
            send(topic, piece.slice(half))
            return
        sent = rows_sent.get(topic, 0)
        sequence = None if producer is None else (producer, sequence_base + sent)
        written = client.produce(topic, body, sequence)
        rows_sent[topic] = sent + piece.num_rows
        result.requests += 1
        if written is None:
            result.duplicates += 1
        result.records += piece.num_rows

    def flush(topic: str) -> None:
        table = pa.Table.from_batches(pending.pop(topic)).combine_chunks()
        pending_bytes.pop(topic)
        rows = table.to_batches()[0] if table.num_rows else None
        if rows is None:
            return
        sizes = value_sizes(rows.column(columns.value)) + 16  # per-record overhead in the body
        if columns.key is not None:
            sizes += value_sizes(rows.column(columns.key))
        ends = np.cumsum(sizes)
        start = 0
        while start < rows.num_rows:
            before = int(ends[start - 1]) if start else 0
            stop = int(np.searchsorted(ends, before + options.chunk_bytes, side="right"))
            stop = max(stop, start + 1)
            send(topic, rows.slice(start, stop - start))
            start = stop

    try:
        for batch in batches:
            for topic, rows in _by_topic(batch, columns, options):
                if topic not in result.topics:
                    result.topics.append(topic)
                pending.setdefault(topic, []).append(rows)
                size = int(value_sizes(rows.column(columns.value)).sum())
                pending_bytes[topic] = pending_bytes.get(topic, 0) + size
                if pending_bytes[topic] >= options.chunk_bytes:
                    flush(topic)
        for topic in list(pending):
            flush(topic)
    except ValueError as exc:  # a column the broker cannot take: say which
        raise OptionError(f"the tqbroker sink cannot write these rows: {exc}") from None
    return result


def _column(batch: pa.RecordBatch, index: int | None) -> pa.Array | None:
    return None if index is None else batch.column(index)


def _by_topic(
    batch: pa.RecordBatch, columns: SinkColumns, options: SinkOptions
) -> list[tuple[str, pa.RecordBatch]]:
    if options.topic is not None:
        return [(options.topic, batch)]
    assert columns.topic is not None
    topics = batch.column(columns.topic)
    if topics.null_count:
        raise OptionError(
            "the tqbroker sink's column 'topic' is null in some rows (fill it, or set the "
            "'topic' option)"
        )
    import pyarrow.compute as pc  # here, not at the top: readers never need it (~30 ms)

    distinct = pc.unique(topics).to_pylist()
    if len(distinct) == 1:
        return [(distinct[0], batch)]
    return [(topic, batch.filter(pc.equal(topics, topic))) for topic in distinct]
