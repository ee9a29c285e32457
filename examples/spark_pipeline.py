"""A Spark structured-streaming pipeline on tqbroker streams, end to end.

1. events — ``{"user": ..., "amount": ..., "at": <ISO time>}`` — are published over AMQP (pika,
   with publisher confirms) to the partitioned stream ``events``, the user as routing key (so
   each user's events stay in one partition, in order);
2. a Spark structured-streaming job reads ``events`` with ``format("tqbroker")``, counts and sums
   them per user and 10-second window of event time, and writes the results as JSON to the
   stream ``event-counts`` with the ``tqbroker`` sink (keyed by user; output mode complete:
   each trigger writes the whole result table);
3. the results are read back with the command line: ``python -m tqbroker ctl consume``.

Needs Java 17+ and, from the checkout's root (the partitioner plugin makes partitioned
topics; pika publishes, httpx declares the topics)::

    python3 -m pip install -e ".[spark,partitioner]" -e plugins/partitioner pika httpx

Run it against a local broker (AMQP on 5672, HTTP on 15672, guest/guest)::

    python3 -m tqbroker &                      # if none is running
    python3 examples/spark_pipeline.py

or let it start a broker of its own for the run, on ephemeral ports of 127.0.0.1, with its
data and the job's checkpoint in a temporary directory: ``python3 examples/spark_pipeline.py
--start-broker``. Against a running broker, running it again publishes more events; the job
resumes from its checkpoint (``--checkpoint``) and reads only the new ones.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pika

EVENTS = "events"
RESULTS = "event-counts"
USERS = ["alice", "bob", "carol", "dave", "erin"]


@contextmanager
def broker_addresses(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    """The AMQP URL, the HTTP API address and the job's checkpoint: the ones given, or a broker
    of our own with a new checkpoint (both in a temporary directory, removed afterwards)."""
    if not args.start_broker:
        yield args.amqp, args.http, args.checkpoint
        return
    from tqbroker.testing import start_broker_process

    with tempfile.TemporaryDirectory(prefix="tqbroker-example-") as scratch:
        data_dir, checkpoint = Path(scratch) / "data", Path(scratch) / "checkpoint"
        with start_broker_process(data_dir, durable_backend="log") as broker:
            yield broker.url, f"http://{broker.host}:{broker.http_port}", str(checkpoint)


def declare_topics(http: str) -> None:
    with httpx.Client(base_url=http, auth=("guest", "guest")) as client:
        for topic, partitions in ((EVENTS, 2), (RESULTS, 1)):
            response = client.put(f"/topics/{topic}", json={"partitions": partitions})
            response.raise_for_status()


def publish_events(amqp: str, count: int) -> None:
    """``count`` events over the last minute, published with confirms."""
    now = datetime.datetime.now(datetime.UTC)
    connection = pika.BlockingConnection(pika.URLParameters(amqp))
    channel = connection.channel()
    channel.confirm_delivery()
    for _ in range(count):
        user = random.choice(USERS)
        event = {
            "user": user,
            "amount": round(random.uniform(1, 100), 2),
            "at": (now - datetime.timedelta(seconds=random.uniform(0, 60))).isoformat(),
        }
        channel.basic_publish(
            EVENTS,
            user,
            json.dumps(event).encode(),
            pika.BasicProperties(content_type="application/json", delivery_mode=2),
        )
    connection.close()
    print(f"published {count} events to '{EVENTS}' over AMQP")


def run_spark_job(http: str, checkpoint: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pyarrow, tqbroker
    from pyspark.sql import functions as F

    from tqbroker.spark import loopback_builder, register

    spark = (
        loopback_builder("tqbroker-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    events = (
        spark.readStream.format("tqbroker")
        .option("tqbroker.url", http)
        .option("subscribe", EVENTS)
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.from_json(
                F.col("value").cast("string"), "user string, amount double, at timestamp"
            ).alias("event")
        )
        .select("event.*")
    )
    totals = events.groupBy(F.window("at", "10 seconds"), "user").agg(
        F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("total")
    )
    results = totals.select(
        F.col("user").alias("key"),
        F.to_json(F.struct(F.col("window.start").alias("window"), "user", "events", "total")).alias(
            "value"
        ),
    )
    query = (
        results.writeStream.format("tqbroker")
        .option("tqbroker.url", http)
        .option("topic", RESULTS)
        .option("checkpointLocation", checkpoint)
        .outputMode("complete")  # Python sinks take append and complete, not update
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    rows = sum(max(0, p["sink"].get("numOutputRows", 0)) for p in query.recentProgress)
    print(f"the Spark job wrote {rows} window results to '{RESULTS}'")
    spark.stop()


def show_results(amqp: str, http: str) -> None:
    with httpx.Client(base_url=http, auth=("guest", "guest")) as client:
        offsets = client.get(f"/topics/{RESULTS}/offsets").json()["partitions"]
    count = sum(p["latest"] - p["earliest"] for p in offsets)
    command = [sys.executable, "-m", "tqbroker", "ctl", "consume", RESULTS, "--from", "first"]
    command += ["-n", str(count), "--idle", "5", "--url", http, "--amqp-url", amqp]
    print("$ python -m tqbroker ctl consume", RESULTS, "--from first -n", count)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--http", default="http://127.0.0.1:15672")
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument(
        "--checkpoint",
        default=str(Path(tempfile.gettempdir()) / "tqbroker-spark-pipeline-checkpoint"),
        help="the job's checkpoint against a running broker (--start-broker makes a new one)",
    )
    parser.add_argument(
        "--start-broker", action="store_true", help="run a broker of our own for the run"
    )
    args = parser.parse_args()
    with broker_addresses(args) as (amqp, http, checkpoint):
        declare_topics(http)
        publish_events(amqp, args.events)
        run_spark_job(http, checkpoint)
        show_results(amqp, http)


if __name__ == "__main__":
    main()
