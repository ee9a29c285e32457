"""A Kafka consumer group's commit, and every acknowledged record, survive a broker killed
with SIGKILL; a member of the group after the restart resumes exactly at the commit.

Kafka's contract: an OffsetCommit is answered once the offsets are written to the group's
``__consumer_offsets`` partition as an acks=all produce is (``GroupMetadataManager`` appends
them with ``requiredAcks = config.offsetCommitRequiredAcks``, ``offsets.commit.required.acks``,
-1 by default), and a consumer that joins the group afterwards starts each
partition at its committed offset (OffsetFetch; ``auto.offset.reset`` applies only where there
is none: ``ConsumerConfig.AUTO_OFFSET_RESET_DOC``). A record acknowledged to an ``acks=all``
producer is never lost ("the leader will wait for the full set of in-sync replicas to
acknowledge the record. This guarantees that the record will not be lost as long as at least
one in-sync replica remains alive", ``ProducerConfig.ACKS_DOC``); here ``all`` means fsync'd,
so a kill -9 loses none. The restarted broker listens on another ephemeral Kafka port: the
clients reconnect through the new bootstrap address.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata
from kafka import TopicPartition as KafkaTopicPartition

from tests.kafka_listener.clients import committed, consume, create_topic, ends, position
from tests.support.polling import eventually
from tqbroker.testing import BrokerProcess, start_broker_process

pytestmark = pytest.mark.timeout(90)

PARTITIONS = 3
RECORDS = 300
GROUP_OPTIONS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 200}
# kafka-python's and aiokafka's names for a member that commits by hand
PYTHON_MEMBER_OPTIONS: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 200,
}

Positions = dict[tuple[int, int], bytes | None]  # (partition, offset) -> value


def start(data_dir: Path) -> BrokerProcess:
    return start_broker_process(data_dir, durable_backend="log")


# -- confluent-kafka ---------------------------------------------------------------------------


class ConfluentProducing:
    """An ``acks=all`` keyed producer; ``acked`` has what its delivery callback reported
    written."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "partitioner": "murmur2_random",
                "message.timeout.ms": 3000,  # what is in flight at the kill fails soon
            }
        )
        self.topic = topic
        self.acked: Positions = {}
        self.failed = 0

    def _delivered(self, error: Any, message: Any) -> None:
        if error is None:
            self.acked[position(message)] = message.value()
        else:
            self.failed += 1

    def produce(self, values: range) -> None:
        for n in values:
            key, value = b"k%d" % (n % 30), b"v%d" % n
            self.producer.produce(self.topic, value, key, on_delivery=self._delivered)
            self.producer.poll(0)


def confluent_read_and_commit(bootstrap: str, topic: str, group: str, count: int) -> Positions:
    """Read ``count`` records or a few more as a member of ``group`` and commit what was read,
    synchronously; what was read."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **GROUP_OPTIONS,
        }
    )
    read: Positions = {}
    try:
        consumer.subscribe([topic])

        def enough() -> bool:
            for message in consumer.consume(num_messages=20, timeout=0.2):
                assert message.error() is None, message.error()
                read[position(message)] = message.value()
            return len(read) >= count

        eventually(enough, timeout=30, what=f"{count} records read")
        offsets = [ConfluentTopicPartition(topic, p, n) for p, n in ends(read).items()]
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()
    return read


def confluent_resume(bootstrap: str, topic: str, group: str, until: Positions) -> list[Any]:
    """A new member of ``group`` reading until it has every record of ``until``; the
    ``(partition, offset, value)`` of each record it got, in order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **GROUP_OPTIONS,
        }
    )
    got: list[Any] = []
    try:
        consumer.subscribe([topic])

        def everything() -> bool:
            for message in consumer.consume(num_messages=100, timeout=0.2):
                assert message.error() is None, message.error()
                got.append((*position(message), message.value()))
            return set(until) <= {(p, o) for p, o, _value in got}

        eventually(everything, timeout=30, what="the records after the commit")
    finally:
        consumer.close()
    return got


def test_confluent_kafka_resumes_at_the_commit_after_kill_9(tmp_path: Path) -> None:
    broker = start(tmp_path)
    try:
        create_topic(broker, "k9-ck", PARTITIONS)
        producing = ConfluentProducing(broker.kafka_bootstrap, "k9-ck")
        producing.produce(range(RECORDS))
        assert producing.producer.flush(15) == 0
        assert len(producing.acked) == RECORDS
        read = confluent_read_and_commit(broker.kafka_bootstrap, "k9-ck", "k9-ck-g", RECORDS // 2)
        commit = committed_by(read)
        assert committed(broker, "k9-ck", "k9-ck-g") == commit
        # More records in flight at the kill: the ones acknowledged must be there afterwards.
        halt = threading.Event()

        def produce_on() -> None:
            n = RECORDS
            while not halt.is_set():
                producing.produce(range(n, n + 10))
                n += 10
                time.sleep(0.005)

        thread = threading.Thread(target=produce_on, daemon=True)
        thread.start()
        eventually(lambda: len(producing.acked) >= RECORDS + 100, what="records acked in flight")
        broker.kill()
        halt.set()
        thread.join(timeout=10)
        producing.producer.flush(15)  # the rest fail (message.timeout.ms)
    finally:
        if broker.proc.poll() is None:
            broker.kill()
    assert producing.failed  # some were in flight at the kill
    with start(tmp_path) as restarted:
        assert committed(restarted, "k9-ck", "k9-ck-g") == commit
        after = {k: v for k, v in producing.acked.items() if k[1] >= (commit[k[0]] or 0)}
        got = confluent_resume(restarted.kafka_bootstrap, "k9-ck", "k9-ck-g", after)
        assert_resumed_at(commit, got, producing.acked)
        # Everything stored (more than was acknowledged, maybe): read until 2 s bring nothing.
        everything = consume(restarted, "k9-ck", 100_000, consumer_timeout_ms=2000)
    stored = {(r.partition, r.offset): r.value for r in everything}
    assert producing.acked.items() <= stored.items()  # every acknowledged record, unchanged


def assert_resumed_at(commit: dict[int, int | None], got: list[Any], acked: Positions) -> None:
    """Each partition read from its committed offset on (the earliest where none), without a
    gap or a repeat, up to every acknowledged record, each with the value produced."""
    for partition, start_at in commit.items():
        offsets = [o for p, o, _value in got if p == partition]
        start_at = start_at or 0
        assert offsets == list(range(start_at, start_at + len(offsets))), (partition, offsets[:5])
        assert {o for p, o in acked if p == partition and o >= start_at} <= set(offsets)
    for p, o, value in got:
        assert acked.get((p, o), value) == value


def committed_by(read: Iterable[tuple[int, int]]) -> dict[int, int | None]:
    """What a member that read ``read`` commits: the offset after the last one it read of each
    partition (None: it read none)."""
    last = ends(read)
    return {p: last.get(p) for p in range(PARTITIONS)}


# -- kafka-python ------------------------------------------------------------------------------


def kafka_python_member(bootstrap: str, topic: str, group: str) -> KafkaConsumer:
    return KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, **PYTHON_MEMBER_OPTIONS
    )


def kafka_python_read(consumer: KafkaConsumer, into: list[Any], count: int) -> Callable[[], bool]:
    """A condition for ``eventually``: polls ``consumer`` into ``into`` (``(partition, offset,
    value)``) until it has ``count``."""

    def polled() -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            into.extend((r.partition, r.offset, r.value) for r in records)
        return len(into) >= count

    return polled


def test_kafka_python_resumes_at_the_commit_after_kill_9(tmp_path: Path) -> None:
    broker = start(tmp_path)
    acked: Positions = {}
    try:
        create_topic(broker, "k9-kp", PARTITIONS)
        producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, acks="all")
        try:
            values = [b"v%d" % n for n in range(RECORDS)]
            sent = [producer.send("k9-kp", v, key=v[-1:]) for v in values]
            for value, future in zip(values, sent, strict=True):
                metadata = future.get(timeout=15)
                acked[(metadata.partition, metadata.offset)] = value
        finally:
            producer.close()
        consumer = kafka_python_member(broker.kafka_bootstrap, "k9-kp", "k9-kp-g")
        read: list[Any] = []
        try:
            eventually(kafka_python_read(consumer, read, RECORDS // 2), timeout=30)
            commit = committed_by((p, o) for p, o, _value in read)
            consumer.commit(
                {
                    KafkaTopicPartition("k9-kp", p): OffsetAndMetadata(end, "", -1)
                    for p, end in commit.items()
                    if end is not None
                }
            )
        finally:
            consumer.close()
        assert committed(broker, "k9-kp", "k9-kp-g") == commit
        broker.kill()
    finally:
        if broker.proc.poll() is None:
            broker.kill()
    with start(tmp_path) as restarted:
        assert committed(restarted, "k9-kp", "k9-kp-g") == commit
        consumer = kafka_python_member(restarted.kafka_bootstrap, "k9-kp", "k9-kp-g")
        got: list[Any] = []
        try:
            eventually(
                kafka_python_read(consumer, got, RECORDS - sum(n or 0 for n in commit.values())),
                timeout=30,
            )
        finally:
            consumer.close()
        assert_resumed_at(commit, got, acked)
        everything = consume(restarted, "k9-kp", RECORDS)
    assert {(r.partition, r.offset): r.value for r in everything} == acked


# -- aiokafka ----------------------------------------------------------------------------------


def aiokafka_member(bootstrap: str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, **PYTHON_MEMBER_OPTIONS
    )


async def aiokafka_read(consumer: AIOKafkaConsumer, count: int) -> list[Any]:
    """``(partition, offset, value)`` of each record ``consumer`` got until it has ``count``."""
    got: list[Any] = []
    while len(got) < count:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            got.extend((r.partition, r.offset, r.value) for r in records)
    return got


async def aiokafka_produce_and_commit(bootstrap: str) -> tuple[Positions, dict[int, int | None]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    acked: Positions = {}
    try:
        values = [b"v%d" % n for n in range(RECORDS)]
        sent = [await producer.send("k9-aio", v, key=v[-1:]) for v in values]
        for value, metadata in zip(values, await asyncio.gather(*sent), strict=True):
            acked[(metadata.partition, metadata.offset)] = value
    finally:
        await producer.stop()
    consumer = aiokafka_member(bootstrap, "k9-aio", "k9-aio-g")
    await consumer.start()
    try:
        read = await aiokafka_read(consumer, RECORDS // 2)
        commit = committed_by((p, o) for p, o, _value in read)
        await consumer.commit(
            {AioTopicPartition("k9-aio", p): end for p, end in commit.items() if end is not None}
        )
    finally:
        await consumer.stop()
    return acked, commit


async def aiokafka_resume(bootstrap: str, count: int) -> list[Any]:
    consumer = aiokafka_member(bootstrap, "k9-aio", "k9-aio-g")
    await consumer.start()
    try:
        return await aiokafka_read(consumer, count)
    finally:
        await consumer.stop()


def test_aiokafka_resumes_at_the_commit_after_kill_9(tmp_path: Path) -> None:
    broker = start(tmp_path)
    try:
        create_topic(broker, "k9-aio", PARTITIONS)
        acked, commit = asyncio.run(
            asyncio.wait_for(aiokafka_produce_and_commit(broker.kafka_bootstrap), 60)
        )
        assert committed(broker, "k9-aio", "k9-aio-g") == commit
        broker.kill()
    finally:
        if broker.proc.poll() is None:
            broker.kill()
    with start(tmp_path) as restarted:
        assert committed(restarted, "k9-aio", "k9-aio-g") == commit
        remaining = RECORDS - sum(n or 0 for n in commit.values())
        got = asyncio.run(
            asyncio.wait_for(aiokafka_resume(restarted.kafka_bootstrap, remaining), 60)
        )
        assert_resumed_at(commit, got, acked)
        everything = consume(restarted, "k9-aio", RECORDS)
    assert {(r.partition, r.offset): r.value for r in everything} == acked


# -- kcat --------------------------------------------------------------------------------------


def kcat_member(bootstrap: str, *arguments: str) -> list[Any]:
    """``kcat -G`` in group ``k9-kcat-g`` until ``arguments`` stop it (``-c N``: N records;
    ``-e``: the end of every assigned partition); ``(partition, offset, value)`` of each record
    it printed. librdkafka's auto-commit commits what it handed over when kcat closes."""
    done = subprocess.run(
        [
            *("kcat", "-b", bootstrap, "-G", "k9-kcat-g", "-f", "%p %o %s\n"),
            *("-X", "auto.offset.reset=earliest", "-X", "session.timeout.ms=6000"),
            *(*arguments, "k9-kcat"),
        ],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [
        (int(p), int(o), value.encode())
        for p, o, value in (line.split() for line in done.stdout.splitlines())
    ]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="Debian's kcat is not installed")
def test_kcat_resumes_at_the_commit_after_kill_9(tmp_path: Path) -> None:
    broker = start(tmp_path)
    try:
        create_topic(broker, "k9-kcat", PARTITIONS)
        # kcat -P exits 0 once every record was delivered, acknowledged by all in-sync replicas
        produced = subprocess.run(
            [
                *("kcat", "-b", broker.kafka_bootstrap, "-P", "-t", "k9-kcat", "-K:"),
                *("-X", "acks=all", "-X", "partitioner=murmur2_random"),
            ],
            input="".join(f"k{n % 30}:v{n}\n" for n in range(RECORDS)),
            text=True,
            capture_output=True,
            timeout=60,
        )
        assert produced.returncode == 0, produced.stderr
        acked: Positions = {
            (r.partition, r.offset): r.value for r in consume(broker, "k9-kcat", RECORDS)
        }
        assert len(acked) == RECORDS
        read = kcat_member(broker.kafka_bootstrap, "-c", str(RECORDS // 2))
        assert len(read) == RECORDS // 2
        commit = committed_by((p, o) for p, o, _value in read)
        assert committed(broker, "k9-kcat", "k9-kcat-g") == commit
        broker.kill()
    finally:
        if broker.proc.poll() is None:
            broker.kill()
    with start(tmp_path) as restarted:
        assert committed(restarted, "k9-kcat", "k9-kcat-g") == commit
        got = kcat_member(restarted.kafka_bootstrap, "-e")
        assert_resumed_at(commit, got, acked)
        assert len(got) == RECORDS - RECORDS // 2
