"""What the listener's client tests share: creating a topic and reading a group's committed
offsets over the HTTP API, reading a topic back with kafka-python, and checking what a consumer
group read against what was produced."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import httpx
from kafka import KafkaConsumer, TopicPartition

from tqbroker.testing import BrokerProcess, RunningBroker


def create_topic(broker: RunningBroker | BrokerProcess, name: str, partitions: int) -> None:
    """``PUT /topics/{name}`` with ``partitions`` partitions (201: created)."""
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put(f"/topics/{name}", json={"partitions": partitions}).status_code == 201


def committed(broker: RunningBroker | BrokerProcess, topic: str, group: str) -> dict[int, Any]:
    """The group's committed offset of each partition (None: none), as the HTTP API shows it
    (``GET /topics/{topic}/groups/{group}``)."""
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        described = http.get(f"/topics/{topic}/groups/{group}").json()
    return {p["partition"]: p["committed"] for p in described["partitions"]}


def position(message: Any) -> tuple[int, int]:
    """A confluent-kafka message's ``(partition, offset)``."""
    partition, offset = message.partition(), message.offset()
    assert partition is not None
    assert offset is not None
    return partition, offset


def ends(positions: Iterable[tuple[int, int]]) -> dict[int, int]:
    """The offset after the last of each partition's ``(partition, offset)``."""
    last: dict[int, int] = {}
    for partition, offset in positions:
        last[partition] = max(last.get(partition, -1), offset + 1)
    return last


def consume(
    broker: RunningBroker | BrokerProcess, name: str, count: int, **options: Any
) -> list[Any]:
    """Up to ``count`` records of every partition of topic ``name``, from the earliest (10 s
    without a record ends it, unless ``consumer_timeout_ms`` says otherwise)."""
    options.setdefault("consumer_timeout_ms", 10_000)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **options,
    )
    try:
        consumer.assign([TopicPartition(name, p) for p in consumer.partitions_for_topic(name)])
        got = []
        for record in consumer:
            got.append(record)
            if len(got) == count:
                break
        return got
    finally:
        consumer.close()


def assert_read_once(
    produced: Iterable[tuple[int, int]], consumed: Iterable[tuple[int, int]]
) -> None:
    """Every produced ``(partition, offset)`` was consumed, none twice, nothing else."""
    counts = Counter(consumed)
    twice = sorted(position for position, n in counts.items() if n > 1)
    assert not twice, f"read more than once: {twice[:20]} ({len(twice)})"
    missing = sorted(set(produced) - set(counts))
    assert not missing, f"never read: {missing[:20]} ({len(missing)})"
    assert set(counts) == set(produced)
