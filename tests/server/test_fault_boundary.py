"""A bug in the handling of one connection (an unexpected exception in a channel method, a
delivery, the heartbeat task, the writer) closes that connection alone: ``connection.close``
541 INTERNAL_ERROR (or a dropped socket when the writer itself failed), logged with its
traceback, while a healthy client on another connection (the canary) keeps doing round trips
without a gap and new connections are still accepted."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
import trio

from tests.support.canary import Canary
from tqbroker.broker.vhost import VirtualHost
from tqbroker.model import Message
from tqbroker.server.connection import AMQPConnection
from tqbroker.server.writer import ConnectionWriter
from tqbroker.testing import RunningBroker, running_broker


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


@pytest.fixture
def canary(broker: RunningBroker) -> Iterator[Canary]:
    with Canary(broker.host, broker.port) as watching:
        yield watching


def connect(broker: RunningBroker, **params: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(host=broker.host, port=broker.port, **params)
    )


def round_trip(broker: RunningBroker) -> None:
    """A new connection is accepted and works."""
    connection = connect(broker)
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"after")
    for _ in range(50):
        _method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if body is not None:
            break
        connection.sleep(0.02)
    assert body == b"after"
    connection.close()


def logged_tracebacks(caplog: pytest.LogCaptureFixture, exc_type: type[BaseException]) -> int:
    found = 0
    for record in caplog.records:
        if record.exc_info is None or record.levelno < logging.ERROR:
            continue
        exc = record.exc_info[1]
        inner = exc.exceptions if isinstance(exc, BaseExceptionGroup) else [exc]
        found += any(isinstance(e, exc_type) for e in inner)
    return found


def fail_declaring(monkeypatch: pytest.MonkeyPatch, name: str, exc: Exception) -> None:
    """Make queue.declare of ``name`` raise ``exc`` (a bug in the method's handling)."""
    original = VirtualHost.create_declared  # every declare that creates a queue calls it

    def create_declared(self: VirtualHost, found: tuple[str, str, Any], **kwargs: Any) -> Any:
        if found[0] == name:
            raise exc
        return original(self, found, **kwargs)

    monkeypatch.setattr(VirtualHost, "create_declared", create_declared)


def test_storage_trouble_in_a_channel_method_closes_only_its_channel(
    broker: RunningBroker,
    canary: Canary,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An OSError raised by a method's handling is storage trouble, not a lost socket and not a
    bug: the channel closes with 506 (out of space or descriptors; else 541), logged at
    WARNING without a traceback; the connection goes on."""
    fail_declaring(monkeypatch, "full", OSError(28, "No space left on device"))
    client = connect(broker)
    channel = client.channel()
    with (
        caplog.at_level(logging.WARNING, logger="tqbroker.server"),
        pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed,
    ):
        channel.queue_declare("full")
    assert closed.value.reply_code == 506
    assert closed.value.reply_text == (
        "RESOURCE_ERROR - cannot queue.declare: [Errno 28] No space left on device"
    )
    assert any("queue.declare failed" in r.getMessage() for r in caplog.records)
    assert logged_tracebacks(caplog, OSError) == 0
    assert client.channel().queue_declare("fine").method.queue == "fine"
    client.close()
    canary.check()


def test_a_bug_in_a_channel_method_closes_only_its_connection(
    broker: RunningBroker,
    canary: Canary,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    exc = KeyError("boom")
    fail_declaring(monkeypatch, "poison", exc)
    victim = connect(broker)
    bystander = connect(broker)  # another idle client: not affected either
    channel = victim.channel()
    channel.queue_declare("fine")
    with (
        caplog.at_level(logging.ERROR, logger="tqbroker.server"),
        pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed,
    ):
        channel.queue_declare("poison")
    assert closed.value.reply_code == 541
    assert closed.value.reply_text.startswith("INTERNAL_ERROR - ")
    assert logged_tracebacks(caplog, type(exc)) == 1
    canary.check()
    assert bystander.channel().queue_declare("fine", passive=True).method.queue == "fine"
    bystander.close()
    for _ in range(3):
        round_trip(broker)
    canary.check()


def test_a_bug_in_a_delivery_closes_the_consumers_connection(
    broker: RunningBroker, canary: Canary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery that failed is requeued (tracked before it was written) and goes to the
    next consumer."""
    original = AMQPConnection.write_delivers  # a queue with one consumer delivers batches
    failures: list[Message] = []

    def write_delivers(self: AMQPConnection, *args: Any) -> int:
        entries: list[tuple[int, Message, bool]] = args[-1]
        for _id, message, _redelivered in entries:
            if message.body == b"poison" and not failures:
                failures.append(message)
                raise RuntimeError("cannot encode")
        return original(self, *args)

    monkeypatch.setattr(AMQPConnection, "write_delivers", write_delivers)
    publisher = connect(broker)
    publishing = publisher.channel()
    publishing.queue_declare("work")
    consumer = connect(broker)
    consuming = consumer.channel()
    consuming.basic_consume("work", lambda *_: None)
    publishing.basic_publish("", "work", b"poison")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        consumer.sleep(5)
    assert closed.value.reply_code == 541
    assert failures
    canary.check()
    # Requeued for the next consumer.
    again = connect(broker)
    got: list[bytes] = []
    for _ in range(100):
        method, _properties, body = again.channel().basic_get("work", auto_ack=True)
        if method is not None:
            got.append(body)
            break
        again.sleep(0.02)
    assert got == [b"poison"]
    again.close()
    publisher.close()
    canary.check()


def test_a_bug_in_the_heartbeat_task_closes_its_connection(
    broker: RunningBroker, canary: Canary, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def heartbeats(self: ConnectionWriter, interval: float) -> None:
        await trio.sleep(0.05)
        raise RuntimeError("heartbeat bug")

    monkeypatch.setattr(ConnectionWriter, "heartbeats", heartbeats)
    victim = connect(broker, heartbeat=2)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        victim.sleep(3)
    assert closed.value.reply_code == 541
    monkeypatch.undo()
    canary.check()
    round_trip(broker)


def test_a_failing_writer_drops_only_its_connection(
    broker: RunningBroker,
    canary: Canary,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    original = trio.SocketStream.send_all

    async def send_all(self: trio.SocketStream, data: bytes) -> None:
        if b"poison-writer" in bytes(data):
            raise RuntimeError("writer bug")
        await original(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", send_all)
    victim = connect(broker)
    with (
        caplog.at_level(logging.ERROR, logger="tqbroker.server"),
        pytest.raises(pika.exceptions.AMQPConnectionError),
    ):
        victim.channel().queue_declare("poison-writer")  # its declare-ok fails to go out
    assert logged_tracebacks(caplog, RuntimeError) == 1
    canary.check()
    round_trip(broker)
    canary.check()


async def test_the_listener_survives_a_connection_that_raises(
    tqbroker_broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: ``serve`` goes on when a connection's ``run`` itself fails."""
    original = AMQPConnection.run
    calls: list[AMQPConnection] = []

    async def run(self: AMQPConnection) -> None:
        calls.append(self)
        if len(calls) == 1:
            raise RuntimeError("run bug")
        await original(self)

    monkeypatch.setattr(AMQPConnection, "run", run)
    for _ in range(2):
        stream = await trio.open_tcp_stream(tqbroker_broker.host, tqbroker_broker.port)
        await stream.send_all(b"AMQP\x00\x00\x09\x01")
        received = await stream.receive_some(4096)
        if len(calls) == 1:
            assert received == b""  # closed by the listener
        else:
            assert received[:1] == b"\x01"  # connection.start
        await stream.aclose()
    assert len(calls) == 2
