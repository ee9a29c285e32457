"""The ``tqbroker`` source in a real local SparkSession against a real broker: batch reads with
every offset option, streaming reads with ``maxOffsetsPerTrigger``, a restart from the
checkpoint, ``failOnDataLoss`` both ways, and bad options."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pika
import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.support.polling import eventually
from tqbroker.testing import RunningBroker

if TYPE_CHECKING:
    from .conftest import Topics

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

KAFKA_SCHEMA = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
    "timestamp:timestamp,timestampType:int>"
)


def load(spark: SparkSession, broker: RunningBroker, **options: str) -> DataFrame:
    return (
        spark.read.format("tqbroker").options(**{"tqbroker.url": broker.http_url, **options}).load()
    )


def stream(spark: SparkSession, broker: RunningBroker, **options: str) -> DataFrame:
    reader = spark.readStream.format("tqbroker")
    return reader.options(**{"tqbroker.url": broker.http_url, **options}).load()


def positions(df: DataFrame) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())


@pytest.fixture(scope="module")
def orders(topics: Topics) -> dict[str, Any]:
    """Topic ``orders``: 3 partitions; 300 records in two rounds, the second at or after
    ``boundary`` (ms)."""
    topics.create("orders", 3)
    first = topics.produce("orders", [{"key": f"k{i % 10}", "value": f"v{i}"} for i in range(200)])
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.01)
    second = topics.produce(
        "orders", [{"key": f"k{i % 10}", "value": f"v{i}"} for i in range(200, 300)]
    )
    return {"first": first, "second": second, "boundary": boundary}


def test_batch_read_gives_every_record_in_kafkas_schema(
    spark: SparkSession, broker: RunningBroker, orders: dict[str, Any]
) -> None:
    before = time.time()
    df = load(spark, broker, subscribe="orders")
    assert df.schema.simpleString() == KAFKA_SCHEMA
    rows = df.collect()
    landed = orders["first"] + orders["second"]
    assert sorted((r.partition, r.offset) for r in rows) == sorted(landed)
    by_position = {(r.partition, r.offset): r for r in rows}
    for i, where in enumerate(landed):
        row = by_position[where]
        assert (row.key, row.value, row.topic) == (
            f"k{i % 10}".encode(),
            f"v{i}".encode(),
            "orders",
        )
        assert row.timestampType == 1
        assert row.timestamp.timestamp() <= before + 1
    # Keys land where Kafka's partitioner puts them, through the topic's exchange.
    assert len({(r.key, r.partition) for r in rows}) == 10


def test_batch_read_with_offsets_json(
    spark: SparkSession, broker: RunningBroker, orders: dict[str, Any]
) -> None:
    landed = Counter(p for p, _ in orders["first"] + orders["second"])
    df = load(
        spark,
        broker,
        subscribe="orders",
        startingOffsets=json.dumps({"orders": {"0": 2, "1": -2, "2": 5}}),
        endingOffsets=json.dumps({"orders": {"0": 10, "1": -1, "2": 6}}),
    )
    expected = [(0, o) for o in range(2, 10)] + [(1, o) for o in range(landed[1])] + [(2, 5)]
    assert positions(df) == expected
    # assign: only the partitions named
    assigned = load(spark, broker, assign=json.dumps({"orders": [1]}))
    assert positions(assigned) == [(1, o) for o in range(landed[1])]


def test_batch_read_by_timestamp(
    spark: SparkSession, broker: RunningBroker, orders: dict[str, Any]
) -> None:
    first, second, boundary = orders["first"], orders["second"], orders["boundary"]
    after = load(spark, broker, subscribe="orders", startingTimestamp=str(boundary))
    assert positions(after) == sorted(second)
    before = load(spark, broker, subscribe="orders", endingTimestamp=str(boundary))
    assert positions(before) == sorted(first)
    mixed = load(
        spark,
        broker,
        subscribe="orders",
        startingOffsetsByTimestamp=json.dumps({"orders": {"0": boundary, "1": 0, "2": 0}}),
        endingOffsetsByTimestamp=json.dumps({"orders": {"0": 2**50, "1": boundary, "2": 2**50}}),
    )
    expected = [w for w in first + second if w[0] == 2]
    expected += [w for w in second if w[0] == 0] + [w for w in first if w[0] == 1]
    assert positions(mixed) == sorted(expected)
    future = str(2**50)
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy=latest"):
        load(spark, broker, subscribe="orders", startingTimestamp=future).collect()
    latest = load(
        spark,
        broker,
        subscribe="orders",
        startingTimestamp=future,
        startingOffsetsByTimestampStrategy="latest",
    )
    assert latest.count() == 0


def test_batch_read_of_headers_plain_streams_and_split_ranges(
    spark: SparkSession, broker: RunningBroker, topics: Topics
) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    connection.channel().queue_declare("plain", durable=True, arguments={"x-queue-type": "stream"})
    connection.close()
    first: list[dict[str, object]] = [
        {"value": "one", "headers": {"h": "x", "n": 7, "b": [1, "a"]}},
        {"value": "two", "key": "k"},
    ]
    topics.produce("plain", first + [{"value": f"v{i}"} for i in range(98)])
    df = load(spark, broker, subscribe="plain", includeHeaders="true")
    assert df.schema.simpleString() == KAFKA_SCHEMA.replace(
        ">", ",headers:array<struct<key:string,value:binary>>>"
    )
    rows = df.orderBy("offset").collect()
    assert len(rows) == 100
    assert [(h.key, h.value) for h in rows[0].headers] == [
        ("h", b"x"),
        ("n", b"7"),
        ("b", b'[1,"a"]'),
    ]
    assert rows[0].key is None
    assert rows[1].key == b"k"
    assert rows[1].headers is None
    split = load(spark, broker, subscribe="plain", maxRecordsPerPartition="30")
    assert split.rdd.getNumPartitions() == 4
    assert positions(split) == [(0, o) for o in range(100)]
    assert load(spark, broker, subscribe="plain", minPartitions="5").rdd.getNumPartitions() == 5


def run_available_now(df: DataFrame, checkpoint: Path, output: Path, **options: str) -> Any:
    query = (
        df.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(output))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def test_streaming_read_with_max_offsets_per_trigger(
    spark: SparkSession, broker: RunningBroker, topics: Topics, tmp_path: Path
) -> None:
    topics.create("rate", 3)
    landed = topics.produce("rate", [{"key": f"key-{i % 7}", "value": f"v{i}"} for i in range(900)])
    df = stream(
        spark, broker, subscribe="rate", startingOffsets="earliest", maxOffsetsPerTrigger="200"
    )
    query = (
        df.select("partition", "offset")
        .writeStream.format("memory")
        .queryName("rate_out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 900
    assert len(sizes) >= 5
    assert all(size <= 200 for size in sizes)
    assert sizes[:4] == [200] * 4  # exactly the budget while the backlog lasts
    last = query.recentProgress[-1]["sources"][0]
    end = json.loads(last["endOffset"])
    per_partition = Counter(p for p, _ in landed)
    assert end == {"rate": {str(p): n for p, n in sorted(per_partition.items())}}
    assert json.loads(last["latestOffset"]) == end
    assert positions(spark.table("rate_out")) == sorted(landed)


def test_query_stopped_mid_stream_resumes_from_its_checkpoint_exactly_once(
    spark: SparkSession, broker: RunningBroker, topics: Topics, tmp_path: Path
) -> None:
    topics.create("resume", 2)
    landed = topics.produce("resume", [{"key": f"k{i}", "value": f"v{i}"} for i in range(2000)])
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    df = stream(
        spark, broker, subscribe="resume", startingOffsets="earliest", maxOffsetsPerTrigger="150"
    )
    query = (
        df.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(output))
        .start()
    )
    eventually(lambda: query.lastProgress and query.lastProgress["batchId"] >= 2, 120, 0.1)
    landed += topics.produce(
        "resume", [{"key": f"k{i}", "value": f"v{i}"} for i in range(2000, 2500)]
    )
    query.stop()  # mid-stream: a batch in flight is dropped and redone after the restart
    done = spark.read.parquet(str(output)).count()
    assert 0 < done < 2500
    run_available_now(
        stream(spark, broker, subscribe="resume", maxOffsetsPerTrigger="1000"), checkpoint, output
    )
    result = spark.read.parquet(str(output))
    assert positions(result) == sorted(landed)  # every one, once
    assert result.count() == 2500


def test_fail_on_data_loss_after_retention(
    spark: SparkSession, broker: RunningBroker, topics: Topics, tmp_path: Path
) -> None:
    topics.create(
        "lossy",
        1,
        **{"x-stream-max-segment-size-bytes": 1 << 20, "x-max-length-bytes": 2 << 20},
    )
    big = "x" * (128 << 10)

    def fill(count: int) -> dict[str, int]:
        start = topics.offsets("lossy")[0]
        for i in range(count):
            topics.produce("lossy", [{"value": f"{i:06d}{big}"}])
        eventually(
            lambda: topics.offsets("lossy")[0]["earliest"] > start["latest"] - 1,
            30,
            what="retention removing a segment",
        )
        return topics.offsets("lossy")[0]

    # A streaming query reads everything there is, then retention removes more than that.
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    topics.produce("lossy", [{"value": f"{i:06d}{big}"} for i in range(8)])
    run_available_now(
        stream(spark, broker, subscribe="lossy", startingOffsets="earliest"), checkpoint, output
    )
    assert spark.read.parquet(str(output)).count() == 8
    now = fill(48)
    assert now["earliest"] > 8

    # Batch: offset 0 is gone.
    start = json.dumps({"lossy": {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        load(spark, broker, subscribe="lossy", startingOffsets=start).collect()
    skipped = load(spark, broker, subscribe="lossy", startingOffsets=start, failOnDataLoss="false")
    assert positions(skipped) == [(0, o) for o in range(now["earliest"], now["latest"])]

    # Streaming, restarted from its checkpoint (at offset 8, gone now).
    with pytest.raises(Exception, match=r"offsets 8 to \d+ of lossy/0 are gone.*failOnDataLoss"):
        run_available_now(stream(spark, broker, subscribe="lossy"), checkpoint, output)
    run_available_now(
        stream(spark, broker, subscribe="lossy", failOnDataLoss="false"), checkpoint, output
    )
    result = spark.read.parquet(str(output))
    expected = [(0, o) for o in range(8)] + [(0, o) for o in range(now["earliest"], now["latest"])]
    assert positions(result) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options 'subscribe'"),
        ({"subscribe": "nope"}, "is topic 'nope' declared"),
        ({"subscribe": "orders", "tqbroker.password": "wrong"}, "tqbroker.password"),
        ({"subscribe": "orders", "tqbroker.url": "http://127.0.0.1:1"}, "cannot reach tqbroker"),
        ({"subscribe": "orders", "startingOffsets": '{"orders": {"0": 1}}'}, "missing: orders/1"),
        ({"subscribe": "orders", "startingOffsets": "latest"}, "cannot be 'latest'"),
        (
            {
                "subscribe": "orders",
                "endingOffsets": '{"orders": {"0": 0, "1": 0, "2": 0}}',
                "startingOffsets": '{"orders": {"0": 1, "1": 0, "2": 0}}',
            },
            "after it ends at 0",
        ),
    ],
)
def test_bad_batch_options_give_clear_errors(
    spark: SparkSession,
    broker: RunningBroker,
    orders: dict[str, Any],
    options: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(Exception, match=message):
        load(spark, broker, **options).collect()


def test_bad_streaming_options_and_schemas_give_clear_errors(
    spark: SparkSession, broker: RunningBroker, orders: dict[str, Any]
) -> None:
    with pytest.raises(Exception, match="'endingOffsets' applies to batch queries only"):
        stream(spark, broker, subscribe="orders", endingOffsets="latest").writeStream.format(
            "noop"
        ).start().awaitTermination(30)
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("tqbroker").schema("value string").option(
            "subscribe", "orders"
        ).load().collect()
