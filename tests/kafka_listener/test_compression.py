"""Compressed batches (gzip, snappy, lz4, zstd) from each Kafka client, stored as produced and
served as produced: a Fetch sends the very bytes the producer sent (its codec, its records,
its CRC; only the base offset is the log's: Kafka's CRC does not cover it,
``DefaultRecordBatch.java``), while AMQP consumers, the HTTP topic API and the Spark source's
frame read get each record decompressed, with its offset, key and headers. The stored batches
survive a restart (the log's recovery reads them as any frame).

Kafka's codec ids (``CompressionType.java``): 1 gzip, 2 snappy, 3 lz4, 4 zstd.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pika
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer

from tests.kafka_listener.raw import call
from tqbroker.config import BrokerConfig
from tqbroker.protocol.kafka.records import decode_batches
from tqbroker.spark._arrow_read import decode_fetch
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(180)
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
COUNT = 40


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def make_topic(broker: RunningBroker, name: str) -> None:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put(f"/topics/{name}", json={"partitions": 1}).status_code == 201


def produced(n: int) -> tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]:
    return b"key-%d" % (n % 5), b"value %d " % n * 20, [("n", str(n).encode())]


def stored_codecs(broker: RunningBroker, topic: str) -> list[int]:
    """The codec of each batch a raw Fetch (version 10) returns from offset 0."""
    body = {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 24,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 24,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
    }
    response = call(broker.kafka_bootstrap, 1, 10, body)
    (partition,) = response["responses"][0]["partitions"]
    assert partition["error_code"] == 0
    batches = decode_batches(partition["records"])
    assert sum(len(b.records) for b in batches) == COUNT
    return [b.compression for b in batches]


def check_every_reader(broker: RunningBroker, topic: str) -> None:
    """pika (with each delivery's offset), the HTTP JSON read and the Spark source's frame read
    get every record decompressed, in order."""
    expected = [produced(n) for n in range(COUNT)]
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    got: list[Any] = []
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        arguments = {"x-stream-offset": "first"}
        for method, properties, body in channel.consume(
            f"{topic}-0", arguments=arguments, inactivity_timeout=10
        ):
            assert method is not None, "no delivery within 10 s"
            got.append((method.routing_key, body, properties.headers))
            channel.basic_ack(method.delivery_tag)
            assert properties.headers["x-stream-offset"] == len(got) - 1
            if len(got) == COUNT:
                break
    finally:
        connection.close()
    assert [(k.encode(), v, h["n"]) for k, v, h in got] == [(k, v, h[0][1]) for k, v, h in expected]
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        read = http.get(f"/topics/{topic}/messages", params={"offset": 0, "limit": COUNT})
        path = f"/topics/{topic}/partitions/0/records"
        frames = http.get(path, params={"format": "frames", "offset": 3, "end": COUNT}).content
    values = [r["value"] for r in read.json()["messages"]]
    assert values == [v.decode() for _k, v, _h in expected]
    fetched = decode_fetch(frames, topic, 0, include_headers=False, start=3, end=COUNT)
    assert fetched.batch.column("value").to_pylist() == [v for _k, v, _h in expected[3:]]
    assert fetched.batch.column("key").to_pylist() == [k for k, _v, _h in expected[3:]]
    assert fetched.batch.column("offset").to_pylist() == list(range(3, COUNT))


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_batches_are_stored_and_served_as_produced(
    broker: RunningBroker, codec: str
) -> None:
    topic = f"ck-{codec}"
    make_topic(broker, topic)
    produce_with_confluent_kafka(broker, topic, codec)
    assert set(stored_codecs(broker, topic)) == {CODECS[codec]}
    consumer = Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    got: list[Any] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(got) < COUNT and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                got.append((message.key(), message.value(), message.headers(), message.offset()))
    finally:
        consumer.close()
    assert got == [(*produced(n), n) for n in range(COUNT)]
    check_every_reader(broker, topic)


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_are_stored_and_served_as_produced(
    broker: RunningBroker, codec: str
) -> None:
    topic = f"kp-{codec}"
    make_topic(broker, topic)
    producer = KafkaProducer(
        bootstrap_servers=broker.kafka_bootstrap, compression_type=codec, linger_ms=50
    )
    try:
        futures = [
            producer.send(topic, key=k, value=v, headers=h, partition=0)
            for k, v, h in map(produced, range(COUNT))
        ]
        assert [f.get(timeout=10).offset for f in futures] == list(range(COUNT))
    finally:
        producer.close()
    assert set(stored_codecs(broker, topic)) == {CODECS[codec]}
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    try:
        got = [
            (m.key, m.value, m.headers, m.offset)
            for _, m in zip(range(COUNT), consumer, strict=False)
        ]
    finally:
        consumer.close()
    assert got == [(*produced(n), n) for n in range(COUNT)]
    check_every_reader(broker, topic)


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_batches_are_stored_and_served_as_produced(
    broker: RunningBroker, codec: str
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"ak-{codec}"
    make_topic(broker, topic)

    async def main() -> list[Any]:
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.kafka_bootstrap, compression_type=codec, linger_ms=50
        )
        await producer.start()
        try:
            batch = [
                producer.send(topic, key=k, value=v, headers=h, partition=0)
                for k, v, h in map(produced, range(COUNT))
            ]
            await asyncio.gather(*[await sent for sent in batch])
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=broker.kafka_bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        got: list[Any] = []
        try:
            while len(got) < COUNT:
                message = await asyncio.wait_for(consumer.getone(), 10)
                got.append((message.key, message.value, list(message.headers), message.offset))
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(main())
    assert got == [(k, v, list(h), n) for n, (k, v, h) in enumerate(map(produced, range(COUNT)))]
    assert set(stored_codecs(broker, topic)) == {CODECS[codec]}


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by .ci/run")
@pytest.mark.parametrize("codec", CODECS)
def test_kcat_batches_are_stored_and_served_as_produced(broker: RunningBroker, codec: str) -> None:
    topic = f"kc-{codec}"
    make_topic(broker, topic)
    lines = "".join(f"k{n % 5}:value {n}\n" for n in range(COUNT))
    subprocess.run(
        ["kcat", "-P", "-b", broker.kafka_bootstrap, "-t", topic, "-p", "0", "-z", codec, "-K:"],
        input=lines.encode(),
        check=True,
        timeout=30,
    )
    assert set(stored_codecs(broker, topic)) == {CODECS[codec]}
    out = subprocess.run(
        [
            *("kcat", "-C", "-b", broker.kafka_bootstrap, "-t", topic, "-o", "beginning"),
            *("-e", "-c", str(COUNT), "-f", "%k:%s:%o\\n"),
        ],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    assert out.splitlines() == [f"k{n % 5}:value {n}:{n}" for n in range(COUNT)]


def produce_with_confluent_kafka(broker: RunningBroker, topic: str, codec: str) -> None:
    producer = Producer(
        {"bootstrap.servers": broker.kafka_bootstrap, "compression.type": codec, "linger.ms": 50}
    )
    for n in range(COUNT):
        key, value, headers = produced(n)
        producer.produce(topic, key=key, value=value, headers=headers, partition=0)
    assert producer.flush(10) == 0


def test_stored_batches_survive_a_restart(tmp_path: Path) -> None:
    config = attrs.evolve(BrokerConfig(), data_dir=tmp_path, port=0)
    with running_broker(config) as first:
        make_topic(first, "restarted")
        produce_with_confluent_kafka(first, "restarted", "zstd")
    with running_broker(config) as second:
        assert set(stored_codecs(second, "restarted")) == {CODECS["zstd"]}
        check_every_reader(second, "restarted")


def stream_bytes(broker: RunningBroker, queue: str) -> int:
    """The bytes of a stream's segments (``GET /topics/{t}``: a stream queue is a topic of one
    partition), once written out (a read seals the open batch)."""
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        (partition,) = http.get(f"/topics/{queue}").json()["partitions"]
        return int(partition["bytes"])


@pytest.mark.parametrize("codec", CODECS)
def test_amqp_publishes_are_stored_compressed_with_the_stream_argument(
    broker: RunningBroker, codec: str
) -> None:
    """``x-stream-compression-type`` (a topic's ``compression.type``) stores the stream's own
    batches compressed: a fraction of the bytes on disk, every property read back as
    published over AMQP, the records over Kafka."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))

    def body(n: int) -> bytes:
        return b'{"event": "page-view", "path": "/products/42", "n": %d}' % n * 10

    try:
        channel = connection.channel()  # no confirms: publishes arrive together, as batches
        for name, argument in ((f"plain-{codec}", "producer"), (f"packed-{codec}", codec)):
            arguments = {"x-queue-type": "stream", "x-stream-compression-type": argument}
            channel.queue_declare(name, durable=True, arguments=arguments)
            properties = pika.BasicProperties(content_type="application/json", headers={"h": 1})
            for n in range(COUNT * 5):
                channel.basic_publish("", name, body(n), properties)
        got = []
        channel.basic_qos(prefetch_count=500)
        for method, properties, delivered in channel.consume(
            f"packed-{codec}", arguments={"x-stream-offset": "first"}, inactivity_timeout=10
        ):
            assert method is not None, "no delivery within 10 s"
            got.append((properties.content_type, properties.headers["h"], delivered))
            channel.basic_ack(method.delivery_tag)
            if len(got) == COUNT * 5:
                break
    finally:
        connection.close()
    assert got == [("application/json", 1, body(n)) for n in range(COUNT * 5)]
    plain, packed = stream_bytes(broker, f"plain-{codec}"), stream_bytes(broker, f"packed-{codec}")
    assert packed < plain / 3, (plain, packed)
    consumer = Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": f"amqp-{codec}"})
    try:
        consumer.assign([TopicPartition(f"packed-{codec}", 0, 0)])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while len(values) < COUNT * 5 and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(500, 1.0) if m.error() is None]
    finally:
        consumer.close()
    assert values == [body(n) for n in range(COUNT * 5)]


def test_a_topic_compression_type_recompresses_what_producers_send(
    broker: RunningBroker,
) -> None:
    """A topic whose ``compression.type`` names a codec stores every batch with it (Kafka's
    ``LogValidator`` recompresses a batch of another codec); ``producer`` keeps each as sent."""
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        configs = {"compression.type": "gzip"}
        response = http.put("/topics/recompressed", json={"partitions": 1, "configs": configs})
        assert response.status_code == 201, response.text
    produce_with_confluent_kafka(broker, "recompressed", "lz4")
    assert set(stored_codecs(broker, "recompressed")) == {CODECS["gzip"]}
    check_every_reader(broker, "recompressed")
