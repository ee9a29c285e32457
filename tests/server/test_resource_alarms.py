"""Memory and disk alarms, as RabbitMQ has them: a connection that publishes while an alarm is set
is told ``connection.blocked`` (reason ``low on memory`` / ``low on disk``) and not read from
until the alarm clears (``connection.unblocked``); consumers keep being served.

The brokers are subprocesses (their memory is their own), with real clients: pika's and
aio-pika's blocked-connection callbacks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import httpx
import pika
import pytest

from tests.support.polling import eventually
from tqbroker.testing import BrokerProcess, start_broker_process

BODY = b"m" * 65536
GUEST = ("guest", "guest")
# The broker starts at ~55 MiB resident. Past half the watermark a transient queue keeps only
# 1,000 messages in memory (the rest is paged out to disk): 1,000 x 64 KiB takes it over this.
WATERMARK = "100MiB"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with start_broker_process(
        tmp_path / "data",
        extra_args=["--memory-high-watermark", WATERMARK],
        stderr=tmp_path / "broker.log",
        log_level="INFO",
    ) as b:
        yield b


def drain(url: str, queue: str) -> int:
    """Consume everything from ``queue`` on a connection of its own; how many."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    count = 0
    while True:
        method, _props, _body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        count += 1
    connection.close()
    return count


def connection_states(broker: BrokerProcess) -> list[str]:
    """The state of each connection, as the management API reports it."""
    listed = httpx.get(f"{broker.http_url}/api/connections", auth=GUEST, timeout=10)
    return [c["state"] for c in listed.json()]


def test_pika_publisher_is_blocked_over_the_watermark_and_unblocked_after_a_drain(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    events: list[tuple[str, str]] = []
    publisher = pika.BlockingConnection(pika.URLParameters(broker.url))
    publisher.add_on_connection_blocked_callback(
        lambda _c, frame: events.append(("blocked", frame.method.reason))
    )
    publisher.add_on_connection_unblocked_callback(lambda _c, _f: events.append(("unblocked", "")))
    channel = publisher.channel()
    channel.queue_declare("backlog")
    consumer_only = pika.BlockingConnection(pika.URLParameters(broker.url))
    consumer_only.add_on_connection_blocked_callback(
        lambda _c, frame: events.append(("consumer blocked", frame.method.reason))
    )
    consumer_only.channel().queue_declare("other")

    # Published from a thread of its own: once the broker stops reading, a basic_publish may
    # wait for socket room (the blocked notice arriving meanwhile) until the drain below.
    counts = [0]
    deadline = time.monotonic() + 60

    def publish_until_blocked() -> None:
        while not events and time.monotonic() < deadline:
            channel.basic_publish("", "backlog", BODY)
            counts[0] += 1
            publisher.process_data_events(0)

    publishing = threading.Thread(target=publish_until_blocked, daemon=True)
    publishing.start()
    # Blocked: pika says so, or (its thread waiting in a basic_publish for socket room, its
    # callbacks not yet run) the broker's management API does.
    eventually(
        lambda: events or "blocked" in connection_states(broker),
        deadline - time.monotonic(),
        what="the publisher blocked",
    )
    published = counts[0]
    assert published * len(BODY) > 30 * 1024 * 1024  # blocked by the watermark, not at once
    assert set(connection_states(broker)) == {"blocked", "blocking"}  # the consumer: blocking

    # The consumer-only connection is not blocked and is still served.
    consumer_only.process_data_events(0.5)
    assert ("consumer blocked", "low on memory") not in events
    drained = drain(broker.url, "backlog")
    # What the broker had read of the publisher's writes: all but what the two sockets'
    # buffers held (loopback's autotuned buffers reach the tcp_wmem and tcp_rmem maxima).
    assert drained >= published - _in_flight(len(BODY)) - 64
    publishing.join(30)  # its last publish went through once the broker read again
    assert not publishing.is_alive()
    deadline = time.monotonic() + 30
    while not events or events[-1][0] != "unblocked":
        assert time.monotonic() < deadline, "never unblocked after the drain"
        publisher.process_data_events(0.2)
    assert events[0] == ("blocked", "low on memory")
    channel.basic_publish("", "backlog", b"after")  # read again
    publisher.process_data_events(0.2)
    # Nothing the publisher sent was lost: what it sent once blocked arrives after the drain.
    later = [0]

    def all_arrived() -> bool:
        later[0] += drain(broker.url, "backlog")
        return drained + later[0] == counts[0] + 1

    eventually(all_arrived, what=f"all {counts[0] + 1} published messages drained")
    assert later[0] >= 1
    publisher.close()
    consumer_only.close()
    check = httpx.get(f"{broker.http_url}/api/health/checks/local-alarms", auth=GUEST)
    assert (check.status_code, check.json()) == (200, {"status": "ok"})
    log = (tmp_path / "broker.log").read_text()
    assert "memory resource limit alarm set" in log
    assert "memory resource limit alarm cleared" in log


def _in_flight(message_bytes: int) -> int:
    """How many messages of ``message_bytes`` a loopback connection's send and receive
    buffers can hold at most."""
    most = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        most += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return most // message_bytes


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_aio_pika_pauses_its_writes_while_blocked(broker: BrokerProcess) -> None:
    """aiormq (under aio-pika) announces the capability, logs the notifications and holds its
    writes between them."""
    recorder = Recorder()
    logging.getLogger("aiormq.connection").addHandler(recorder)

    async def main() -> None:
        connection = await aio_pika.connect(broker.url)
        channel = await connection.channel(publisher_confirms=False)
        await channel.declare_queue("aio-backlog")
        deadline = time.monotonic() + 60
        while not any("was blocked by" in m for m in recorder.messages):
            assert time.monotonic() < deadline
            publish = channel.default_exchange.publish(aio_pika.Message(BODY), "aio-backlog")
            with contextlib.suppress(TimeoutError):  # held by aiormq once blocked
                await asyncio.wait_for(publish, 1.0)
        assert any("low on memory" in m for m in recorder.messages)
        await asyncio.to_thread(drain, broker.url, "aio-backlog")
        while not any("was unblocked" in m for m in recorder.messages):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        await connection.close()

    try:
        asyncio.run(main())
    finally:
        logging.getLogger("aiormq.connection").removeHandler(recorder)


def test_a_broker_started_on_a_full_disk_starts_with_the_disk_alarm_set(tmp_path: Path) -> None:
    """A disk-free limit above what the disk has: the broker starts (no crash loop), blocks
    publishers with ``low on disk``, and serves consumers."""
    with start_broker_process(
        tmp_path / "data",
        extra_args=["--disk-free-limit", "1000000TB"],
        stderr=tmp_path / "broker.log",
        log_level="INFO",
    ) as b:
        events: list[str] = []
        connection = pika.BlockingConnection(pika.URLParameters(b.url))
        connection.add_on_connection_blocked_callback(
            lambda _c, frame: events.append(frame.method.reason)
        )
        channel = connection.channel()
        channel.queue_declare("q")
        channel.basic_publish("", "q", b"one")  # read, then the connection is blocked
        deadline = time.monotonic() + 10
        while not events:
            assert time.monotonic() < deadline
            connection.process_data_events(0.1)
        assert events == ["low on disk"]
        assert drain(b.url, "q") == 1  # consumers are served
        # Visible as RabbitMQ's health checks show it (compared with RabbitMQ 3.10.8's).
        for path, where in (("alarms", "in the cluster"), ("local-alarms", "on the node")):
            check = httpx.get(f"{b.http_url}/api/health/checks/{path}", auth=GUEST)
            assert check.status_code == 503
            body = check.json()
            assert body["status"] == "failed"
            assert body["reason"] == f"There are alarms in effect {where}"
            assert [a["resource"] for a in body["alarms"]] == ["disk space"]
            assert body["alarms"][0]["node"].startswith("tqbroker@")
        assert httpx.get(f"{b.http_url}/health").json()["alarms"] == ["disk"]
        assert httpx.get(f"{b.http_url}/api/health/checks/alarms").status_code == 401
    assert "disk resource limit alarm set" in (tmp_path / "broker.log").read_text()
