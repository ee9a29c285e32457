"""Kafka listener throughput, side by side with tqbroker's AMQP stream path and RabbitMQ's
native stream protocol, in one run.

    python benchmarks/kafka_throughput.py [--count 1000000] [--size 100] [--rabbitmq auto|none]

Each path is driven by the fastest client it has here:
- **Kafka listener**: confluent-kafka (librdkafka, C) producing ``--count`` records of
  ``--size`` bytes to one partition with ``acks=all`` (answered once fsync'd), 1 MiB batches,
  ``linger.ms=5``, no compression; then a consumer assigned to the partition from offset 0
  reading them all (records produced by a Kafka client are stored as produced and fetched
  without decoding them);
- **AMQP stream path**: our lean raw-socket client (``rawclient.py``) publishing with confirms
  (a confirm comes once fsync'd), 1,000 unconfirmed, and consuming from ``first`` with
  prefetch 1,000 (``streams.py``'s workload);
- **RabbitMQ's stream protocol** (3.10.8, the ``rabbitmq_stream`` plugin on its port):
  ``rabbitmq_stream_peer.py`` (rstream), when RabbitMQ is installed.

For each: records per second and the broker's CPU per record (user + system, all threads, from
``/proc``). The broker is a separate process (``python -m tqbroker``, log backend, fsync per
group commit). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition
from procstats import cpu_seconds
from rawclient import RawClient

from tqbroker.testing import BrokerProcess, start_broker_process

TOPIC = "bench-kafka"


def measured(pid: int, work: Callable[[], int]) -> tuple[float, float]:
    """Run ``work`` (returns how many records it moved): records/s and broker µs a record."""
    cpu, start = cpu_seconds(pid) or 0.0, time.perf_counter()
    count = work()
    elapsed = time.perf_counter() - start
    used = (cpu_seconds(pid) or 0.0) - cpu
    return count / elapsed, used / count * 1e6


def kafka_produce(broker: BrokerProcess, count: int, size: int) -> int:
    producer = Producer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1 << 20,
            "enable.idempotence": False,
        }
    )
    value = b"x" * size
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    for _ in range(count):
        while True:
            try:
                producer.produce(TOPIC, value, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) or failed:
        raise RuntimeError(f"{len(failed)} produce errors: {failed[:3]}")
    return count


def kafka_fetch(broker: BrokerProcess, count: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 << 20,
            "max.partition.fetch.bytes": 10 << 20,
            "queued.max.messages.kbytes": 1 << 20,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    got = 0
    deadline = time.monotonic() + 300
    try:
        while got < count and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is None:
                    got += 1
    finally:
        consumer.close()
    return got


def amqp_stream(broker: BrokerProcess, count: int, size: int) -> tuple[float, float, float, float]:
    publisher = RawClient(broker.port)
    publisher.declare("bench-stream", {"x-queue-type": "stream"})
    pid = broker.proc.pid
    cpu = cpu_seconds(pid) or 0.0
    rate_in = publisher.publish_confirmed("bench-stream", b"x" * size, count, window=1000)
    cpu_in = ((cpu_seconds(pid) or 0.0) - cpu) / count * 1e6
    reader = RawClient(broker.port)
    cpu = cpu_seconds(pid) or 0.0
    rate_out = reader.consume("bench-stream", count, arguments={"x-stream-offset": "first"})
    cpu_out = ((cpu_seconds(pid) or 0.0) - cpu) / count * 1e6
    return rate_in, cpu_in, rate_out, cpu_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rabbitmq", choices=("auto", "none"), default="auto")
    args = parser.parse_args()
    rows: list[tuple[str, float, float, float, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="tqbroker-bench-") as data_dir,
        start_broker_process(Path(data_dir), durable_backend="log") as broker,
    ):
        with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
            http.put(f"/topics/{TOPIC}", json={"partitions": 1}).raise_for_status()
        pid = broker.proc.pid
        produce = measured(pid, lambda: kafka_produce(broker, args.count, args.size))
        fetch = measured(pid, lambda: kafka_fetch(broker, args.count))
        rows.append(("tqbroker Kafka listener (confluent-kafka)", *produce, *fetch))
        rows.append(
            ("tqbroker AMQP stream (raw client)", *amqp_stream(broker, args.count, args.size))
        )
    if args.rabbitmq == "auto":
        from rabbitmq_stream_peer import measure_rabbitmq_stream

        if Path("/usr/sbin/rabbitmq-server").exists():
            peer = measure_rabbitmq_stream(args.count, args.size)
            rows.append(
                (
                    "RabbitMQ 3.10 stream protocol (rstream)",
                    peer["produce_rate"],
                    peer["produce_cpu_us"],
                    peer["consume_rate"],
                    peer["consume_cpu_us"],
                )
            )
    print(f"{args.count:,} records of {args.size} B")
    print("| path | produce rec/s | broker µs/rec | fetch rec/s | broker µs/rec |")
    print("|---|---|---|---|---|")
    for name, rate_in, cpu_in, rate_out, cpu_out in rows:
        print(f"| {name} | {rate_in:,.0f} | {cpu_in:.2f} | {rate_out:,.0f} | {cpu_out:.2f} |")


if __name__ == "__main__":
    main()
