"""The x-key-partition exchange type (plugins/partitioner): Kafka's partitioner bit for bit, and a
partitioned stream fed through it by pika over real sockets."""

from __future__ import annotations

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pika.adapters.blocking_connection import BlockingChannel
from tqbroker_partitioner import KeyPartitionExchange, murmur2, partition_for

from tqbroker.plugins.loader import load_exchange_types
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 6


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (and Sarama's copy of it)
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
        (bytes([12, 42, 56, 24, 109, 111]), 274204207),
    ],
)
def test_murmur2_matches_kafkas_test_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_partition_is_in_range_and_stable(key: bytes, partitions: int) -> None:
    partition = partition_for(key, partitions)
    assert 0 <= partition < partitions
    assert partition == (murmur2(key) & 0x7FFFFFFF) % partitions


def test_registered_through_its_entry_point() -> None:
    assert isinstance(load_exchange_types()["x-key-partition"], KeyPartitionExchange)


@pytest.fixture
def partitioned(channel: BlockingChannel) -> BlockingChannel:
    """A partitioned stream ``orders``: six stream queues behind an x-key-partition exchange."""
    channel.exchange_declare("orders", "x-key-partition", durable=True)
    for p in range(PARTITIONS):
        queue = f"orders-{p}"
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_bind(queue, "orders", str(p))
    channel.confirm_delivery()
    return channel


def read_partition(ch: BlockingChannel, partition: int) -> list[bytes]:
    ch.basic_qos(prefetch_count=100)
    got = []
    for method, _properties, body in ch.consume(
        f"orders-{partition}", arguments={"x-stream-offset": "first"}, inactivity_timeout=0.3
    ):
        if method is None:
            break
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    return got


def test_keyed_messages_land_where_kafka_would_put_them(partitioned: BlockingChannel) -> None:
    keys = [f"customer-{n}" for n in range(30)]
    for round_ in range(2):
        for key in keys:
            partitioned.basic_publish("orders", key, f"{key}/{round_}".encode())
    for p in range(PARTITIONS):
        expected = [
            f"{key}/{round_}".encode()
            for round_ in range(2)
            for key in keys
            if partition_for(key.encode(), PARTITIONS) == p
        ]
        assert read_partition(partitioned, p) == expected


def test_partition_key_header_overrides_the_routing_key(partitioned: BlockingChannel) -> None:
    headers = {"x-partition-key": "abc"}
    partitioned.basic_publish("orders", "ignored", b"m", pika.BasicProperties(headers=headers))
    assert read_partition(partitioned, partition_for(b"abc", PARTITIONS)) == [b"m"]


def test_empty_keys_go_round_robin(partitioned: BlockingChannel) -> None:
    for n in range(2 * PARTITIONS):
        partitioned.basic_publish("orders", "", b"%d" % n)
    assert all(len(read_partition(partitioned, p)) == 2 for p in range(PARTITIONS))


def test_binding_keys_must_be_partition_numbers(tqbroker_thread: RunningBroker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    ch = connection.channel()
    ch.exchange_declare("parts", "x-key-partition")
    ch.queue_declare("p")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_bind("p", "parts", "first")
    assert closed.value.reply_code == 406
    assert "partition numbers" in closed.value.reply_text
    connection.close()
