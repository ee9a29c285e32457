"""Kafka consumer groups (the classic protocol) with kafka-python 3 against the listener:
members of one group split a topic's partitions (client-side assignment: the leader's
assignor), rebalance when a member joins and when one leaves, and commit; a consumer of the
group that starts later resumes from the committed offsets; the committed offsets are the
stream group's of the same name (what ``tqbroker-ctl groups describe`` shows)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import CommitFailedError, RebalanceInProgressError

from tests.support.polling import eventually
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def make_topic(broker: RunningBroker, name: str, partitions: int, records: int) -> None:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put(f"/topics/{name}", json={"partitions": partitions}).status_code == 201
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap)
    for n in range(records):
        producer.send(name, value=b"%d" % n, partition=n % partitions)
    producer.flush()
    producer.close()


def member(broker: RunningBroker, topic: str, group: str, **options: Any) -> KafkaConsumer:
    return KafkaConsumer(
        topic,
        bootstrap_servers=broker.kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        heartbeat_interval_ms=200,
        session_timeout_ms=6000,
        **options,
    )


class Polling:
    """A member polling in a thread of its own (kafka-python's consumer is not thread-safe:
    only this thread touches it), keeping what it got."""

    def __init__(self, consumer: KafkaConsumer) -> None:
        self.consumer = consumer
        self.values: list[bytes] = []
        self.assigned: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                for records in self.consumer.poll(timeout_ms=100).values():
                    self.values += [r.value for r in records]
                if self.values:
                    # A rebalance began: Kafka refuses the commit (27) until the member rejoined.
                    with contextlib.suppress(CommitFailedError, RebalanceInProgressError):
                        self.consumer.commit()
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
        finally:
            self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_members_split_the_partitions_and_rebalance(broker: RunningBroker) -> None:
    make_topic(broker, "kg-split", 6, 60)
    first = Polling(member(broker, "kg-split", "g1"))
    try:
        eventually(lambda: first.assigned == set(range(6)), timeout=30, what="one member, all six")
        second = Polling(member(broker, "kg-split", "g1"))
        third = Polling(member(broker, "kg-split", "g1"))
        polls = [first, second, third]
        eventually(
            lambda: (
                sorted(len(p.assigned) for p in polls) == [2, 2, 2]
                and set().union(*(p.assigned for p in polls)) == set(range(6))
            ),
            timeout=30,
            what="three members, two partitions each",
        )
        third.close()
        eventually(
            lambda: sorted(len(p.assigned) for p in polls[:2]) == [3, 3],
            timeout=30,
            what="the two left, three partitions each",
        )
        eventually(lambda: len(set(first.values + second.values + third.values)) == 60, timeout=30)
        got = first.values + second.values + third.values
        assert set(got) == {b"%d" % n for n in range(60)}
    finally:
        for polling in (first, locals().get("second"), locals().get("third")):
            if polling is not None:
                polling.close()


def test_a_new_member_resumes_from_the_committed_offsets(broker: RunningBroker) -> None:
    make_topic(broker, "kg-resume", 2, 20)
    consumer = member(broker, "kg-resume", "g2", max_poll_records=5)
    got: list[bytes] = []
    try:
        while len(got) < 5:
            for records in consumer.poll(timeout_ms=1000).values():
                got += [r.value for r in records]
        consumer.commit()
        committed = {p: consumer.committed(TopicPartition("kg-resume", p)) for p in range(2)}
    finally:
        consumer.close()
    assert sum(offset or 0 for offset in committed.values()) == len(got)
    later = member(broker, "kg-resume", "g2")
    rest: list[bytes] = []

    def polled() -> bool:
        rest.extend(r.value for records in later.poll(timeout_ms=200).values() for r in records)
        return len(got) + len(rest) >= 20

    try:
        eventually(polled, timeout=30, what="the rest of the records")
    finally:
        later.close()
    assert sorted(got + rest, key=int) == [b"%d" % n for n in range(20)]
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        described = http.get("/topics/kg-resume/groups/g2").json()
    # The stream group of the same name holds the offsets the first member committed.
    assert sum(p["committed"] or 0 for p in described["partitions"]) == len(got)
