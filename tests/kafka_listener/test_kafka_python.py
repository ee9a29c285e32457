"""kafka-python 3 against the Kafka listener of a real broker (a thread, loopback, ephemeral
ports): bootstrap (ApiVersions, Metadata), produce with keys, headers and timestamps (its
default idempotent producer: InitProducerId, acks=all), consume from the earliest and from an
offset, offsets by time; and one set of streams for both protocols: what a Kafka producer
writes pika reads with its offset, what pika publishes a Kafka consumer fetches. Bad requests
are ``test_bad_requests.py``'s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pika
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import InvalidRecordError

from tests.kafka_listener.clients import consume
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def topic(broker: RunningBroker, name: str, partitions: int) -> None:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        response = http.put(f"/topics/{name}", json={"partitions": partitions})
        assert response.status_code == 201, response.text


def test_kafka_python_produces_and_consumes(broker: RunningBroker) -> None:
    topic(broker, "kp-orders", 3)
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap)  # idempotent, acks=all
    sent = []
    for n in range(30):
        future = producer.send(
            "kp-orders",
            key=b"k%d" % (n % 5),
            value=b"v%d" % n,
            headers=[("n", str(n).encode())],
            partition=n % 3,
            timestamp_ms=1_700_000_000_000 + n,
        )
        sent.append(future)
    producer.flush()
    landed = [future.get(timeout=10) for future in sent]
    producer.close()
    assert sorted((m.partition, m.offset) for m in landed) == sorted(
        (p, o) for p in range(3) for o in range(10)
    )
    got = consume(broker, "kp-orders", 30)
    assert sorted(r.value for r in got) == sorted(b"v%d" % n for n in range(30))
    for record in got:
        n = int(record.value[1:])
        assert record.key == b"k%d" % (n % 5)
        assert record.headers == [("n", str(n).encode())]
        assert record.timestamp == 1_700_000_000_000 + n
        assert record.partition == n % 3
        assert record.offset == n // 3


def test_offsets_by_time_and_from_an_offset(broker: RunningBroker) -> None:
    topic(broker, "kp-times", 1)
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap)
    for n in range(10):
        producer.send("kp-times", value=b"t%d" % n, timestamp_ms=1_000_000 + 10 * n)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.kafka_bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition("kp-times", 0)
        found = consumer.offsets_for_times({tp: 1_000_045})[tp]
        assert (found.offset, found.timestamp) == (5, 1_000_050)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        consumer.assign([tp])
        consumer.seek(tp, 7)
        records = consumer.poll(timeout_ms=5000, max_records=10)[tp]
        assert [r.value for r in records] == [b"t7", b"t8", b"t9"]
    finally:
        consumer.close()


def test_one_set_of_streams_for_both_protocols(broker: RunningBroker) -> None:
    topic(broker, "kp-both", 1)
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap)
    producer.send("kp-both", key=b"from-kafka", value=b"k0", headers=[("h", b"1")]).get(10)
    producer.close()
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.basic_publish(
            "kp-both",
            "from-amqp",
            b"a1",
            pika.BasicProperties(headers={"h": "2"}, delivery_mode=2),
        )
        channel.basic_qos(prefetch_count=10)
        seen: list[tuple[int, bytes, str]] = []

        def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            seen.append((properties.headers["x-stream-offset"], body, method.routing_key))
            if len(seen) == 2:
                ch.stop_consuming()

        channel.basic_consume("kp-both-0", on_message, arguments={"x-stream-offset": "first"})
        channel.start_consuming()
    finally:
        connection.close()
    assert seen == [(0, b"k0", "from-kafka"), (1, b"a1", "from-amqp")]
    got = consume(broker, "kp-both", 2)
    assert [(r.offset, r.key, r.value) for r in got] == [
        (0, b"from-kafka", b"k0"),
        (1, b"from-amqp", b"a1"),
    ]
    assert got[1].headers == [("h", b"2")]


def test_a_record_the_stream_cannot_take_is_invalid_record(broker: RunningBroker) -> None:
    """A key that is not UTF-8 or is over 255 bytes (an AMQP routing key is a short string),
    or a header name over 255 bytes: the batch is refused with INVALID_RECORD (87, Kafka's
    answer to a record its broker will not take) and nothing of it is written; the partition
    takes the next batch."""
    topic(broker, "kp-bad", 1)
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, enable_idempotence=False)
    try:
        for key, headers in [(b"\xff\xfe", []), (b"x" * 256, []), (b"k", [("h" * 256, b"")])]:
            with pytest.raises(InvalidRecordError):
                producer.send("kp-bad", key=key, value=b"v", headers=headers).get(10)
        assert producer.send("kp-bad", key=b"k" * 255, value=b"ok").get(10).offset == 0
    finally:
        producer.close()
    (record,) = consume(broker, "kp-bad", 1)
    assert (record.offset, record.key, record.value) == (0, b"k" * 255, b"ok")
