"""A consumer group of three members rebalancing on join and leave while a producer writes,
with confluent-kafka (librdkafka), aiokafka and kcat (kafka-python 3's is in
``test_kafka_groups``): no record is skipped and none read twice.

Kafka's guarantee is at least once, with a duplicate only past the last commit at the
revocation: a member that commits what it processed in ``onPartitionsRevoked`` hands its
partitions over exactly where it stopped ("It is common for the revocation callback to use the
consumer instance in order to commit offsets", ``ConsumerRebalanceListener.java`` in
``clients/src/main/java/org/apache/kafka/clients/consumer/``; the eager protocol calls it
before the member joins again, so the new owner's OffsetFetch sees that commit). The
coordinator takes a commit of the current generation while the group prepares a rebalance
("During PreparingRebalance phase, we still allow a commit request", ``doCommitOffsets`` in
Kafka's ``GroupCoordinator.scala``) and refuses it with REBALANCE_IN_PROGRESS only once the
members joined (CompletingRebalance). Each member here commits synchronously after each
batch and on revocation, so every record is read exactly once. kcat's members (``kcat -G``)
commit as librdkafka's auto-commit does: what was handed to kcat, every interval, at each
revocation and when the member closes on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, RebalanceInProgressError
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.kafka_listener.clients import (
    assert_read_once,
    committed,
    create_topic,
    ends,
    position,
)
from tests.support.polling import eventually, eventually_async
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 6
GROUP_OPTIONS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 200}


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


class GroupMember(Protocol):
    assigned: frozenset[int]
    read: list[tuple[int, int]]


def run_phases(
    members: Sequence[GroupMember],
    join: Callable[[int], None],
    leave: Callable[[int], None],
    produced: Callable[[], int],
) -> None:
    """Members 0, 1 and 2 join one after the other, then 2 leaves; each step waits for the
    partitions to be split evenly among the members in the group and records to flow to each
    of them (``produced`` counts what the producer has had acknowledged)."""

    def split(among: Sequence[GroupMember]) -> Callable[[], bool]:
        size = PARTITIONS // len(among)
        return lambda: (
            all(len(m.assigned) == size for m in among)
            and frozenset().union(*(m.assigned for m in among)) == frozenset(range(PARTITIONS))
        )

    def flowing(among: Sequence[GroupMember]) -> Callable[[], bool]:
        start = [len(m.read) for m in among]
        return lambda: all(len(m.read) > n for m, n in zip(among, start, strict=True))

    for n in range(3):
        join(n)
        eventually(split(members[: n + 1]), timeout=15, what=f"{n + 1} members, an even split")
        eventually(flowing(members[: n + 1]), timeout=10, what=f"records to all {n + 1}")
    leave(2)
    eventually(split(members[:2]), timeout=15, what="the two left, three partitions each")
    eventually(flowing(members[:2]), timeout=10, what="records to the two left")
    assert produced() > 0


# -- confluent-kafka ---------------------------------------------------------------------------


class ConfluentProducing:
    """A keyed producer (``murmur2_random``: Java's partitioner) writing in a thread of its
    own until ``stop()``; ``acked`` has each delivered record's ``(partition, offset)``."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
        self.topic = topic
        self.acked: list[tuple[int, int]] = []
        self.halt = threading.Event()
        self.pausing = threading.Event()
        self.idle = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _delivered(self, error: Any, message: Any) -> None:
        assert error is None, error
        self.acked.append(position(message))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No record produced meanwhile; every one before acknowledged."""
        self.pausing.set()
        assert self.idle.wait(timeout=10)
        try:
            yield
        finally:
            self.idle.clear()
            self.pausing.clear()

    def _run(self) -> None:
        n = 0
        while not self.halt.is_set():
            if self.pausing.is_set():
                if not self.idle.is_set():
                    assert self.producer.flush(10) == 0
                    self.idle.set()
                time.sleep(0.01)
                continue
            for _ in range(10):
                key, value = b"k%d" % (n % 60), b"%d" % n
                self.producer.produce(self.topic, value, key, on_delivery=self._delivered)
                n += 1
            self.producer.poll(0)
            time.sleep(0.01)

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(timeout=10)
        assert self.producer.flush(10) == 0


class ConfluentMember:
    """A member polling in a thread of its own, committing synchronously after each batch and
    in ``on_revoke``."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": GROUP_OPTIONS["session_timeout_ms"],
                "heartbeat.interval.ms": GROUP_OPTIONS["heartbeat_interval_ms"],
            }
        )
        self.topic = topic
        self.assigned: frozenset[int] = frozenset()
        self.read: list[tuple[int, int]] = []
        self.next: dict[int, int] = {}  # partition -> the offset after the last one read
        self.refused: list[str] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _commit(self, partitions: set[int]) -> None:
        offsets = [TopicPartition(self.topic, p, self.next[p]) for p in partitions & set(self.next)]
        if offsets:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                self.refused.append(str(exc))

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned = frozenset(tp.partition for tp in partitions)

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        revoked = {tp.partition for tp in partitions}
        self._commit(revoked)
        for p in revoked:
            self.next.pop(p, None)
        self.assigned = frozenset()

    def _run(self) -> None:
        try:
            self.consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked)
            while not self.halt.is_set():
                batch = self.consumer.consume(num_messages=100, timeout=0.1)
                for message in batch:
                    assert message.error() is None, message.error()
                    partition, offset = position(message)
                    self.read.append((partition, offset))
                    self.next[partition] = offset + 1
                self._commit({p for p, _offset in self.read[len(self.read) - len(batch) :]})
        finally:
            self.consumer.close()

    def close(self) -> None:
        self.halt.set()
        self.thread.join(timeout=20)
        assert not self.thread.is_alive()


@pytest.mark.timeout(45)
def test_confluent_kafka_group_rebalances_without_gap_or_duplicate(
    broker: RunningBroker,
) -> None:
    create_topic(broker, "rb-confluent", PARTITIONS)
    producing = ConfluentProducing(broker.kafka_bootstrap, "rb-confluent")
    members: list[ConfluentMember] = []
    try:
        run_phases(
            members,
            lambda n: members.append(
                ConfluentMember(broker.kafka_bootstrap, "rb-confluent", "rb-confluent-g")
            ),
            lambda n: members[n].close(),
            lambda: len(producing.acked),
        )
        producing.stop()
        total = len(producing.acked)
        eventually(
            lambda: sum(len(m.read) for m in members) >= total,
            timeout=15,
            what=f"all {total} records read",
        )
    finally:
        producing.halt.set()
        for member in members:
            member.close()
    assert not [r for m in members for r in m.refused]
    assert_read_once(producing.acked, [p for m in members for p in m.read])
    # The last commits (after the last batch, or at the revocation) are at each partition's end.
    assert committed(broker, "rb-confluent", "rb-confluent-g") == ends(producing.acked)


# -- aiokafka ----------------------------------------------------------------------------------


class AioMember(ConsumerRebalanceListener):  # type: ignore[misc]
    """A member's task: ``getmany`` and a commit after each batch, and a commit in
    ``on_partitions_revoked`` (aiokafka awaits the listener before it joins again)."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **GROUP_OPTIONS,
        )
        self.topic = topic
        self.assigned: frozenset[int] = frozenset()
        self.read: list[tuple[int, int]] = []
        self.next: dict[int, int] = {}
        self.refused: list[str] = []
        self.halt = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    async def _commit(self, partitions: set[int]) -> None:
        offsets = {
            AioTopicPartition(self.topic, p): self.next[p] for p in partitions & set(self.next)
        }
        if offsets:
            try:
                await self.consumer.commit(offsets)
            except (CommitFailedError, RebalanceInProgressError) as exc:
                self.refused.append(repr(exc))

    async def on_partitions_revoked(self, revoked: Any) -> None:
        partitions = {tp.partition for tp in revoked}
        await self._commit(partitions)
        for p in partitions:
            self.next.pop(p, None)
        self.assigned = frozenset()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.assigned = frozenset(tp.partition for tp in assigned)

    async def _run(self) -> None:
        await self.consumer.start()
        try:
            self.consumer.subscribe([self.topic], listener=self)
            while not self.halt.is_set():
                batches = await self.consumer.getmany(timeout_ms=100)
                for tp, records in batches.items():
                    self.read += [(tp.partition, r.offset) for r in records]
                    self.next[tp.partition] = records[-1].offset + 1
                await self._commit({tp.partition for tp in batches})
        finally:
            await self.consumer.stop()

    async def close(self) -> None:
        self.halt.set()
        await asyncio.wait_for(self.task, 20)


async def aiokafka_rebalances(bootstrap: str) -> tuple[list[tuple[int, int]], list[AioMember]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    acked: list[tuple[int, int]] = []
    halt = asyncio.Event()

    async def produce() -> None:
        n = 0
        while not halt.is_set():
            sent = [
                await producer.send("rb-aio", key=b"k%d" % (k % 60), value=b"%d" % k)
                for k in range(n, n + 10)
            ]
            n += 10
            for metadata in await asyncio.gather(*sent):
                acked.append((metadata.partition, metadata.offset))

    members: list[AioMember] = []
    producing = asyncio.ensure_future(produce())
    try:
        # The phases' waits poll from a thread so that the loop runs the members meanwhile.
        loop = asyncio.get_running_loop()

        def join(n: int) -> None:
            asyncio.run_coroutine_threadsafe(add_member(), loop).result(10)

        async def add_member() -> None:
            members.append(AioMember(bootstrap, "rb-aio", "rb-aio-g"))

        def leave(n: int) -> None:
            asyncio.run_coroutine_threadsafe(members[n].close(), loop).result(25)

        await asyncio.to_thread(run_phases, members, join, leave, lambda: len(acked))
        halt.set()
        await producing
        await eventually_async(
            lambda: sum(len(m.read) for m in members) >= len(acked),
            timeout=15,
            what="all records read",
        )
    finally:
        halt.set()
        with contextlib.suppress(Exception):
            await producing
        for member in members:
            await member.close()
        await producer.stop()
    return acked, members


@pytest.mark.timeout(45)
def test_aiokafka_group_rebalances_without_gap_or_duplicate(broker: RunningBroker) -> None:
    create_topic(broker, "rb-aio", PARTITIONS)
    acked, members = asyncio.run(asyncio.wait_for(aiokafka_rebalances(broker.kafka_bootstrap), 40))
    assert not [r for m in members for r in m.refused]
    assert_read_once(acked, [p for m in members for p in m.read])
    assert committed(broker, "rb-aio", "rb-aio-g") == ends(acked)


# -- kcat --------------------------------------------------------------------------------------


class KcatMember:
    """``kcat -G``: a balanced consumer printing each record's partition and offset, its
    assignments read from what it reports on stderr (``% Group ... rebalanced ...: assigned:
    topic [0], ...``). Where to start comes from ``auto.offset.reset``, not ``-o``: kcat's
    ``rebalance_cb`` sets each assigned partition to ``-o``'s offset, over the commit."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.process = subprocess.Popen(
            [
                *("kcat", "-b", bootstrap, "-G", group, "-u"),
                *("-f", "%p %o\n"),
                *("-X", f"session.timeout.ms={GROUP_OPTIONS['session_timeout_ms']}"),
                *("-X", f"heartbeat.interval.ms={GROUP_OPTIONS['heartbeat_interval_ms']}"),
                *("-X", "auto.commit.interval.ms=200", "-X", "auto.offset.reset=earliest"),
                topic,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.assigned: frozenset[int] = frozenset()
        self.read: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._records, daemon=True),
            threading.Thread(target=self._reports, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _records(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            partition, offset = line.split()
            self.read.append((int(partition), int(offset)))

    def _reports(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if "rebalanced" in line:
                partitions = frozenset(int(p) for p in re.findall(r"\[(\d+)\]", line))
                self.assigned = partitions if "assigned:" in line else frozenset()
            elif "ERROR" in line or "FAIL" in line:
                self.errors.append(line.strip())

    def close(self) -> None:
        self.process.terminate()  # kcat closes its consumer: a last commit, then it leaves
        assert self.process.wait(timeout=20) == 0
        for thread in self.threads:
            thread.join(timeout=10)
        for pipe in (self.process.stdout, self.process.stderr):
            assert pipe is not None
            pipe.close()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="Debian's kcat is not installed")
@pytest.mark.timeout(45)
def test_kcat_group_rebalances_without_gap_or_duplicate(broker: RunningBroker) -> None:
    create_topic(broker, "rb-kcat", PARTITIONS)
    producing = ConfluentProducing(broker.kafka_bootstrap, "rb-kcat")
    members: list[KcatMember] = []

    def read_everything(among: list[KcatMember]) -> bool:
        return set(producing.acked) <= {p for m in among for p in m.read}

    def leave(n: int) -> None:
        # A record kcat polls after SIGTERM is not printed, yet librdkafka stored its offset
        # as it handed it over (kcat's consume_cb returns at once once told to stop), and the
        # close commits it: the member leaves once it has caught up, with nothing in flight.
        with producing.paused():
            eventually(lambda: read_everything(members), timeout=10, what="members caught up")
            members[n].close()

    try:
        run_phases(
            members,
            lambda n: members.append(KcatMember(broker.kafka_bootstrap, "rb-kcat", "rb-kcat-g")),
            leave,
            lambda: len(producing.acked),
        )
        producing.stop()
        eventually(lambda: read_everything(members), timeout=15, what="all records read")
    finally:
        producing.halt.set()
        for member in members:
            if member.process.poll() is None:
                member.close()
    assert not [e for m in members for e in m.errors]
    assert_read_once(producing.acked, [p for m in members for p in m.read])
    assert committed(broker, "rb-kcat", "rb-kcat-g") == ends(producing.acked)
