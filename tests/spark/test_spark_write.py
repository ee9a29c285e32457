"""The ``tqbroker`` sink in a real local SparkSession against a real broker: batch and
streaming writes land in order with keys routed as AMQP publishes are (Kafka's partitioner),
a replayed micro-batch is not written twice, and bad input gives clear errors."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tqbroker_partitioner import partition_for

from tqbroker.testing import RunningBroker

if TYPE_CHECKING:
    from .conftest import Record, Topics

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def save(df: DataFrame, broker: RunningBroker, **options: str) -> None:
    df.write.format("tqbroker").options(**{"tqbroker.url": broker.http_url, **options}).mode(
        "append"
    ).save()


def by_key(records: list[Record]) -> dict[str, list[bytes]]:
    """Each key's values in offset order (records come in partition then offset order)."""
    found: dict[str, list[bytes]] = defaultdict(list)
    for record in records:
        found[record.key].append(record.value)
    return dict(found)


def test_batch_write_lands_in_order_with_keys_routed_by_the_partitioner(
    spark: SparkSession, broker: RunningBroker, topics: Topics
) -> None:
    topics.create("sink", 3)
    rows = [(f"key-{i % 13}", f"value-{i}") for i in range(3000)]
    df = spark.createDataFrame(rows, "key string, value string").coalesce(1)
    save(df, broker, topic="sink", writeChunkBytes="20000")  # several requests
    written = topics.read_all("sink")
    assert len(written) == 3000
    for record in written:
        assert record.partition == partition_for(record.key.encode(), 3)
    for partition in range(3):  # in the DataFrame's order, offsets dense from 0
        mine = [r for r in written if r.partition == partition]
        expected = [v.encode() for k, v in rows if partition_for(k.encode(), 3) == partition]
        assert [r.value for r in mine] == expected
        assert [r.offset for r in mine] == list(range(len(mine)))


def test_batch_write_of_partitions_headers_binary_values_and_topic_column(
    spark: SparkSession, broker: RunningBroker, topics: Topics
) -> None:
    topics.create("sink-a", 2)
    topics.create("sink-b", 1)
    rows = [
        (
            "sink-a",
            "k1",
            bytearray(b"\x00\xff"),
            1,
            [("h", bytearray(b"x")), ("b", bytearray(b"\xfe"))],
        ),
        ("sink-a", None, bytearray(b"keyless"), None, None),
        ("sink-b", "k2", bytearray(b"plain"), None, []),
        ("sink-a", "k3", bytearray(b"forced"), 0, None),
    ]
    df = spark.createDataFrame(
        rows,
        "topic string, key string, value binary, partition int, "
        "headers array<struct<key: string, value: binary>>",
    ).coalesce(1)
    save(df, broker)
    a = {r.value: r for r in topics.read_all("sink-a")}
    assert set(a) == {b"\x00\xff", b"keyless", b"forced"}
    assert a[b"\x00\xff"].partition == 1
    assert a[b"forced"].partition == 0
    assert a[b"\x00\xff"].headers == {"h": "x", "b": {"bytes": "/g=="}}
    assert a[b"keyless"].key == ""
    b = topics.read_all("sink-b")
    assert [(r.key, r.value, r.headers) for r in b] == [("k2", b"plain", {})]
    # The headers read back through the source as they were written.
    back = (
        spark.read.format("tqbroker")
        .options(
            **{"tqbroker.url": broker.http_url, "subscribe": "sink-a", "includeHeaders": "true"}
        )
        .load()
        .where(F.col("key") == F.lit(b"k1"))
        .collect()
    )
    assert [(h.key, h.value) for h in back[0].headers] == [("h", b"x"), ("b", b"\xfe")]


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ("key string", {"topic": "sink"}, "needs a 'value' column"),
        ("value string", {}, "needs the 'topic' option or a 'topic' column"),
        ("value string, key int", {"topic": "sink"}, "column 'key' must be string or binary"),
        ("value string, partition string", {"topic": "sink"}, "'partition' must be an integer"),
        ("value string", {"topic": "nope"}, "is topic 'nope' declared"),
        ("value string", {"topic": "sink", "idempotent": "maybe"}, "option 'idempotent'"),
    ],
)
def test_bad_sink_input_gives_clear_errors(
    spark: SparkSession,
    broker: RunningBroker,
    topics: Topics,
    columns: str,
    options: dict[str, str],
    message: str,
) -> None:
    values = {"string": "1", "int": 1, "binary": bytearray(b"1")}
    row = tuple(values[c.split()[1]] for c in columns.split(", "))
    df = spark.createDataFrame([row], columns)
    with pytest.raises(Exception, match=message):
        save(df, broker, **options)
    with pytest.raises(Exception, match="append-only"):
        df.write.format("tqbroker").option("topic", "sink").mode("overwrite").save()


def test_streaming_write_lands_in_order_and_a_replayed_batch_is_not_written_twice(
    spark: SparkSession, broker: RunningBroker, topics: Topics, tmp_path: Path
) -> None:
    topics.create("events-in", 2)
    topics.create("events-out", 3)
    topics.produce("events-in", [{"key": f"k{i % 17}", "value": f"e{i}"} for i in range(2000)])
    checkpoint = tmp_path / "checkpoint"

    def run(chunk_bytes: str = "4000") -> list[int]:
        source = (
            spark.readStream.format("tqbroker")
            .option("tqbroker.url", broker.http_url)
            .option("subscribe", "events-in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "500")
            .load()
        )
        query = (
            source.select("key", "value")
            .writeStream.format("tqbroker")
            .option("tqbroker.url", broker.http_url)
            .option("topic", "events-out")
            .option("writeChunkBytes", chunk_bytes)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return [p["numInputRows"] for p in query.recentProgress]

    assert sum(run()) == 2000
    inputs = topics.read_all("events-in")
    written = topics.read_all("events-out")
    assert len(written) == 2000
    for record in written:
        assert record.partition == partition_for(record.key.encode(), 3)
    assert by_key(written) == by_key(inputs)  # each key's events in their order

    # Forget that the last batch was committed: the restarted query runs it again, and the
    # broker skips what the sink had written for it (same producer, same row sequences), even
    # though the replay cuts the rows into requests differently.
    commits = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    replayed = run(chunk_bytes="1000000")
    assert sum(replayed) > 0, "the last batch was not replayed"
    assert len(topics.read_all("events-out")) == 2000

    # A new query at the same path (the checkpoint deleted) is a new sink: it writes again.
    shutil.rmtree(checkpoint)
    assert sum(run()) == 2000
    assert len(topics.read_all("events-out")) == 4000
