"""Offsets by position and by time with confluent-kafka, aiokafka and kcat (kafka-python's are
in ``test_kafka_python``): the earliest and latest offsets, the first offset at or after a
timestamp, and a consumer starting at the beginning, the end, an offset relative to the end or
a time.

Kafka's answers (ListOffsets, ``KafkaApis.handleListOffsetRequest`` and
``UnifiedLog.fetchOffsetByTimestamp``): timestamp -2 is the log start offset, -1 the high
watermark, any other the offset of the first record whose timestamp is at or after it, with
that record's timestamp; where no record is that late, offset -1 and timestamp -1
(``ListOffsetsResponse.UNKNOWN_OFFSET`` and ``UNKNOWN_TIMESTAMP``). Each topic here has ten
records stamped 1,000,000 ms + 10 ms times n, so the time 1,000,045 finds offset 5, stamped
1,000,050.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer, TopicPartition
from kafka import KafkaProducer

from tests.kafka_listener.clients import create_topic
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(90)

FIRST_STAMP = 1_000_000
LOOKUP = 1_000_045  # between the records at offsets 4 and 5
PAST_THE_END = 2_000_000


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def stamped_topic(broker: RunningBroker, name: str) -> None:
    """Topic ``name``, one partition, ten records ``t0``..``t9`` stamped 10 ms apart."""
    create_topic(broker, name, 1)
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap)
    try:
        for n in range(10):
            producer.send(name, value=b"t%d" % n, timestamp_ms=FIRST_STAMP + 10 * n).get(10)
    finally:
        producer.close()


# -- confluent-kafka ---------------------------------------------------------------------------


def test_confluent_kafka_offsets_by_time_and_start_positions(broker: RunningBroker) -> None:
    stamped_topic(broker, "off-ck")
    consumer = Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": "off-ck-g",
            "enable.auto.commit": False,
        }
    )
    try:
        assert consumer.get_watermark_offsets(TopicPartition("off-ck", 0), timeout=10) == (0, 10)
        # one lookup per call: librdkafka takes each partition once in a request
        (found,) = consumer.offsets_for_times([TopicPartition("off-ck", 0, LOOKUP)], timeout=10)
        (past,) = consumer.offsets_for_times(
            [TopicPartition("off-ck", 0, PAST_THE_END)], timeout=10
        )
        assert (found.offset, found.error) == (5, None)
        assert past.offset == OFFSET_END  # -1: no record that late
        consumer.assign([TopicPartition("off-ck", 0, OFFSET_BEGINNING)])
        assert [m.value() for m in consumer.consume(num_messages=10, timeout=10)][:1] == [b"t0"]
        # From the end: only what is produced after the consumer got there.
        consumer.assign([TopicPartition("off-ck", 0, OFFSET_END)])
        assert consumer.consume(num_messages=1, timeout=1) == []
        producer = Producer({"bootstrap.servers": broker.kafka_bootstrap})
        producer.produce("off-ck", b"after")
        assert producer.flush(10) == 0
        latest = consumer.consume(num_messages=1, timeout=10)
        assert [(m.offset(), m.value()) for m in latest] == [(10, b"after")]
    finally:
        consumer.close()


# -- aiokafka ----------------------------------------------------------------------------------


async def aiokafka_offsets(bootstrap: str) -> None:
    tp = AioTopicPartition("off-aio", 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        assert await consumer.beginning_offsets([tp]) == {tp: 0}
        assert await consumer.end_offsets([tp]) == {tp: 10}
        found = (await consumer.offsets_for_times({tp: LOOKUP}))[tp]
        assert (found.offset, found.timestamp) == (5, 1_000_050)
        assert await consumer.offsets_for_times({tp: PAST_THE_END}) == {tp: None}
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        assert (await consumer.getone()).value == b"t0"
        await consumer.seek_to_end(tp)
        assert await consumer.position(tp) == 10
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait("off-aio", b"after")
        finally:
            await producer.stop()
        latest = await consumer.getone()
        assert (latest.offset, latest.value) == (10, b"after")
    finally:
        await consumer.stop()


def test_aiokafka_offsets_by_time_and_start_positions(broker: RunningBroker) -> None:
    stamped_topic(broker, "off-aio")
    asyncio.run(asyncio.wait_for(aiokafka_offsets(broker.kafka_bootstrap), 60))


# -- kcat --------------------------------------------------------------------------------------


def kcat(broker: RunningBroker, *arguments: str) -> str:
    done = subprocess.run(
        ["kcat", "-b", broker.kafka_bootstrap, *arguments],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("kcat") is None, reason="Debian's kcat is not installed")
def test_kcat_reads_from_each_kind_of_start(broker: RunningBroker) -> None:
    """kcat's ``-o``: ``beginning``, ``end``, ``-N`` (N before the end), ``s@T`` (the first
    record at or after time T) and ``e@T`` (stop before time T); ``-Q`` looks a time up."""
    stamped_topic(broker, "off-kcat")

    def read(*start: str) -> list[str]:
        return kcat(broker, "-C", "-t", "off-kcat", *start, "-e", "-f", "%o:%s:%T\n").split()

    assert read("-o", "beginning") == [f"{n}:t{n}:{FIRST_STAMP + 10 * n}" for n in range(10)]
    assert read("-o", "end") == []
    assert [line.split(":")[0] for line in read("-o", "-3")] == ["7", "8", "9"]
    assert [line.split(":")[0] for line in read("-o", f"s@{LOOKUP}")] == ["5", "6", "7", "8", "9"]
    between = read("-o", f"s@{LOOKUP}", "-o", f"e@{FIRST_STAMP + 80}")
    assert [line.split(":")[0] for line in between] == ["5", "6", "7"]
    assert kcat(broker, "-Q", "-t", f"off-kcat:0:{LOOKUP}").split() == [
        "off-kcat",
        "[0]",
        "offset",
        "5",
    ]
