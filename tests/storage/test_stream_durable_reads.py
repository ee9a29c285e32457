"""Stream readers see only what is durable: AMQP consumers, ``x-stream-offset: last`` and the
HTTP topic API all stop at the flushed end of the log (the single-node high watermark), so no
reader is ever handed an offset that a crash could give to another message.

The fsync of the log is held (or failed) by fault injection; the clients are real."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.backends.log import segment as segment_module
from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


class HeldSync:
    """The log's fsync, held until released (or failing while ``fail`` is set)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.released = threading.Event()
        self.released.set()
        self.fail = False
        real = segment_module.Segment.sync

        def sync(segment: segment_module.Segment, *, indexes: bool = True) -> None:
            self.released.wait(30)
            if self.fail:
                raise OSError(errno.EIO, "injected I/O error")
            real(segment, indexes=indexes)

        monkeypatch.setattr(segment_module.Segment, "sync", sync)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as b:
        yield b


def consume_all(
    channel: BlockingChannel, queue: str, seconds: float, *, offset: object = "first"
) -> list[tuple[int, bytes]]:
    """What a fresh consumer from ``offset`` receives within ``seconds``: (offset, body)."""
    got: list[tuple[int, bytes]] = []
    for method, properties, body in channel.consume(
        queue, arguments={"x-stream-offset": offset}, inactivity_timeout=seconds
    ):
        if method is None:
            break
        got.append((properties.headers["x-stream-offset"], body))
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    return got


def test_a_live_reader_gets_a_record_only_once_it_is_fsynced(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldSync(monkeypatch)
    publisher = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
    publisher.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
    publisher.basic_publish("", "s", b"durable", PERSISTENT)  # no confirms: returns at once
    reader = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
    reader.basic_qos(prefetch_count=10)
    assert consume_all(reader, "s", 2.0) == [(0, b"durable")]

    held.released.clear()  # the next flush's fsync hangs
    publisher.basic_publish("", "s", b"pending", PERSISTENT)
    publisher.connection.process_data_events(0.2)
    assert consume_all(reader, "s", 1.0) == [(0, b"durable")]  # not the unsynced record
    assert consume_all(reader, "s", 0.5, offset="last") == [(0, b"durable")]
    declared = reader.queue_declare("s", passive=True)
    assert declared.method.message_count == 1

    got: list[tuple[int, bytes]] = []
    live = reader.consume("s", arguments={"x-stream-offset": "first"}, inactivity_timeout=0.5)
    for method, properties, body in live:
        if method is None:
            if held.released.is_set():
                break
            held.released.set()  # the fsync finishes: the waiting reader is woken
            continue
        got.append((properties.headers["x-stream-offset"], body))
        reader.basic_ack(method.delivery_tag)
    assert got == [(0, b"durable"), (1, b"pending")]


def test_http_reads_stop_at_the_durable_end(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldSync(monkeypatch)
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=10) as http:
        assert http.put("/topics/t", json={"partitions": 1}).status_code == 201
        assert http.post("/topics/t/messages", json={"key": "k", "value": "a"}).status_code == 201
        held.released.clear()
        channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        channel.basic_publish("", "t-0", b"b", PERSISTENT)  # its fsync is held
        channel.connection.process_data_events(0.2)
        offsets = http.get("/topics/t/offsets").json()
        read = http.get("/topics/t/messages", params={"partition": 0}).json()
        latest = http.get("/topics/t/messages", params={"partition": 0, "offset": "latest"})
        held.released.set()
        assert [p["latest"] for p in offsets["partitions"]] == [1]
        assert [m["offset"] for m in read["messages"]] == [0]
        assert read["next_offset"] == 1
        assert latest.json()["next_offset"] == 1
        deadline = time.monotonic() + 10
        while http.get("/topics/t/offsets").json()["partitions"][0]["latest"] != 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        read = http.get("/topics/t/messages", params={"partition": 0}).json()
        assert [m["offset"] for m in read["messages"]] == [0, 1]


def test_a_record_whose_fsync_failed_is_never_read(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldSync(monkeypatch)
    channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
    channel.confirm_delivery()
    channel.queue_declare("f", durable=True, arguments={"x-queue-type": "stream"})
    channel.basic_publish("", "f", b"kept", PERSISTENT)
    held.fail = True
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "f", b"lost", PERSISTENT)
    channel.basic_qos(prefetch_count=10)
    assert consume_all(channel, "f", 1.0) == [(0, b"kept")]
