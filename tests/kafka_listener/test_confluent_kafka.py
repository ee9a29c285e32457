"""confluent-kafka (librdkafka 2.16) against the Kafka listener: a keyed producer with
``partitioner=murmur2_random`` (Java's partitioner: librdkafka's default is CRC32-based,
``rdkafka_conf.c``) puts each key in the partition an AMQP publish of the same routing key gets
through the topic's key-partition exchange; a subscribing consumer of a group reads everything
with keys and headers, commits, and the committed offsets read back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pika
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def test_keys_land_where_amqp_puts_them_and_a_group_reads_them(broker: RunningBroker) -> None:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put("/topics/ck-keys", json={"partitions": 3}).status_code == 201
    producer = Producer(
        {"bootstrap.servers": broker.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    landed: dict[bytes, int] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        landed[message.key()] = message.partition()

    for n in range(30):
        producer.produce(
            "ck-keys",
            key=b"key-%d" % (n % 10),
            value=b"v%d" % n,
            headers=[("n", str(n).encode())],
            on_delivery=delivered,
        )
    assert producer.flush(10) == 0
    assert len(set(landed.values())) > 1  # the keys spread over the partitions
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for key in landed:  # AMQP publishes with the same keys
            channel.basic_publish("ck-keys", key.decode(), b"amqp", pika.BasicProperties())
    finally:
        connection.close()
    consumer = Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": "ck-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[Any] = []
    try:
        consumer.subscribe(["ck-keys"])
        deadline = time.monotonic() + 30
        while len(got) < 40 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message)
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition("ck-keys", p) for p in range(3)])
    finally:
        consumer.close()
    assert len(got) == 40
    for message in got:
        assert message.partition() == landed[message.key()], message.key()
        if message.value() != b"amqp":
            n = int(message.value()[1:])
            assert message.headers() == [("n", str(n).encode())]
    counts = {p: sum(1 for m in got if m.partition() == p) for p in range(3)}
    assert {tp.partition: tp.offset for tp in committed} == counts
