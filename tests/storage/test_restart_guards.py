"""What a stream keeps across a crash besides its records (the broker is a subprocess killed
with SIGKILL, clients are pika and httpx over loopback): an idempotent producer's sequences (a
retried write after the restart lands once) and a tracked consumer's offset (stored as it acks,
made durable by the next flush, not only at a clean shutdown)."""

from __future__ import annotations

import time
from array import array
from pathlib import Path

import httpx
import pika
import pytest

from tqbroker.recordbatch import BinaryColumn, WriteBatch, decode_read, encode_write
from tqbroker.testing import start_broker_process

pytestmark = pytest.mark.timeout(90)

STREAM = {"x-queue-type": "stream"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def write_body(values: list[bytes]) -> bytes:
    count = len(values)
    return encode_write(
        WriteBatch(
            array("i", [-1] * count),
            BinaryColumn.of([b""] * count),
            BinaryColumn.of(values),
            BinaryColumn.of([b""] * count),
        )
    )


def test_an_idempotent_producers_sequence_survives_a_crash(tmp_path: Path) -> None:
    def post(http: httpx.Client, values: list[bytes], first: int) -> httpx.Response:
        headers = {"x-producer-id": "job-7", "x-producer-sequence": str(first)}
        return http.post("/topics/once/records", content=write_body(values), headers=headers)

    with start_broker_process(tmp_path) as broker:
        channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        channel.queue_declare("once", durable=True, arguments=STREAM)
        channel.connection.close()
        with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=10) as http:
            written = post(http, [b"r0", b"r1", b"r2"], 0)
            assert written.status_code == 201, written.text  # durable: the write was fsync'd
        broker.kill()
    with (
        start_broker_process(tmp_path) as broker,
        httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=10) as http,
    ):
        retried = post(http, [b"r0", b"r1", b"r2"], 0)  # the client never saw the answer
        assert retried.status_code == 200, retried.text
        assert retried.json()["duplicate"]
        assert post(http, [b"r2", b"r3"], 2).json() == {"count": 1, "skipped": 1}
        batch = decode_read(http.get("/topics/once/partitions/0/records").content, headers=False)
        assert [batch.values[i] for i in range(len(batch))] == [b"r0", b"r1", b"r2", b"r3"]


def consume_tracked(url: str, *, ack: int, take: int) -> list[int]:
    """Consume ``take`` deliveries as the tracked consumer ``reader-1``, acking the first
    ``ack``; their offsets."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=take)
    seen: list[int] = []
    arguments = {"x-stream-automatic-offset-tracking": True, "x-stream-offset": "first"}
    for method, properties, _body in channel.consume(
        "tracked", arguments=arguments, consumer_tag="reader-1", inactivity_timeout=3
    ):
        assert method is not None, f"only {seen} came"
        seen.append(properties.headers["x-stream-offset"])
        if len(seen) <= ack:
            channel.basic_ack(method.delivery_tag)
        if len(seen) == take:
            break
    return seen


def test_a_tracked_offset_is_durable_after_a_flush_not_only_at_shutdown(tmp_path: Path) -> None:
    with start_broker_process(tmp_path) as broker:
        channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        channel.queue_declare("tracked", durable=True, arguments=STREAM)
        channel.confirm_delivery()
        for n in range(10):
            channel.basic_publish("", "tracked", b"%d" % n, PERSISTENT)
        assert consume_tracked(broker.url, ack=4, take=5) == [0, 1, 2, 3, 4]
        # No publish follows: the flusher alone must make the stored offset durable (it polls
        # every 0.2 s for work such as this).
        time.sleep(1.5)
        broker.kill()
    with start_broker_process(tmp_path) as broker:
        assert consume_tracked(broker.url, ack=0, take=2) == [4, 5]
