"""aiokafka 0.14 (asyncio; ApiVersions v0, then the highest version it has a struct for in
each served range) and Debian's kcat (librdkafka 2.0.2, whose features need Produce 3 and
Fetch 4 exactly in the served ranges: ``shared/reference/kafka.md`` §1.1) against the Kafka
listener: produce with keys and headers, a group consumer reading and committing, and kcat's
produce, consume and metadata listing."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def make_topic(broker: RunningBroker, name: str, partitions: int) -> None:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put(f"/topics/{name}", json={"partitions": partitions}).status_code == 201


async def aiokafka_round(bootstrap: str) -> list[Any]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for n in range(10):
            await producer.send_and_wait(
                "aio-t",
                value=b"v%d" % n,
                key=b"k%d" % n,
                headers=[("n", b"%d" % n)],
                partition=n % 2,
            )
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "aio-t",
        bootstrap_servers=bootstrap,
        group_id="aio-g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    got = []
    try:
        async for message in consumer:
            got.append(message)
            if len(got) == 10:
                break
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


def test_aiokafka_produces_and_a_group_consumes(broker: RunningBroker) -> None:
    make_topic(broker, "aio-t", 2)
    got = asyncio.run(asyncio.wait_for(aiokafka_round(broker.kafka_bootstrap), 60))
    assert sorted(m.value for m in got) == sorted(b"v%d" % n for n in range(10))
    for message in got:
        n = int(message.value[1:])
        assert (message.partition, message.offset) == (n % 2, n // 2)
        assert message.key == b"k%d" % n
        assert list(message.headers) == [("n", b"%d" % n)]
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        described = http.get("/topics/aio-t/groups/aio-g").json()
    assert [p["committed"] for p in described["partitions"]] == [5, 5]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="Debian's kcat is not installed")
def test_kcat_produces_consumes_and_lists(broker: RunningBroker) -> None:
    make_topic(broker, "kcat-t", 1)
    bootstrap = broker.kafka_bootstrap
    produced = subprocess.run(
        ["kcat", "-b", bootstrap, "-P", "-t", "kcat-t", "-K:"],
        input="a:1\nb:2\nc:3\n",
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [
            "kcat",
            "-b",
            bootstrap,
            "-C",
            "-t",
            "kcat-t",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%o %k %s\n",
        ],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == "0 a 1\n1 b 2\n2 c 3\n"
    listed = subprocess.run(
        ["kcat", "-b", bootstrap, "-L", "-t", "kcat-t"], text=True, capture_output=True, timeout=60
    )
    assert 'topic "kcat-t" with 1 partitions' in listed.stdout
    assert "partition 0, leader 0, replicas: 0, isrs: 0" in listed.stdout
