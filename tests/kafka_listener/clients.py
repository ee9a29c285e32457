"""What the listener's client tests share: reading a topic back with kafka-python."""

from __future__ import annotations

from typing import Any

from kafka import KafkaConsumer, TopicPartition

from tqbroker.testing import RunningBroker


def consume(broker: RunningBroker, name: str, count: int, **options: Any) -> list[Any]:
    """Up to ``count`` records of every partition of topic ``name``, from the earliest (10 s
    without a record ends it)."""
    consumer = KafkaConsumer(
        bootstrap_servers=broker.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
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
