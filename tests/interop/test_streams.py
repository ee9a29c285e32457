"""Stream queues over AMQP 0-9-1 as RabbitMQ's stream docs show them, with pika and aio-pika
over real sockets: every ``x-stream-offset`` form, the ``x-stream-offset`` header, reading
without removing, RabbitMQ's consumer and declare rules, retention, and restarts."""

from __future__ import annotations

import asyncio
import datetime
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.polling import eventually
from tqbroker import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(60)

STREAM: dict[str, Any] = {"x-queue-type": "stream"}


def fill(ch: BlockingChannel, stream: str, count: int, start: int = 0) -> None:
    ch.confirm_delivery()
    for n in range(start, start + count):
        ch.basic_publish("", stream, b"m%d" % n)


def read(
    ch: BlockingChannel, stream: str, offset: Any, *, limit: int = 1000, idle: float = 0.3
) -> list[tuple[int, bytes]]:
    """Consume from ``offset`` until ``limit`` messages or ``idle`` seconds without one; return
    (x-stream-offset header, body) pairs."""
    ch.basic_qos(prefetch_count=10)
    got: list[tuple[int, bytes]] = []
    for method, properties, body in ch.consume(
        stream, arguments={"x-stream-offset": offset}, inactivity_timeout=idle
    ):
        if method is None:
            break
        got.append((properties.headers["x-stream-offset"], body))
        ch.basic_ack(method.delivery_tag)
        if len(got) >= limit:
            break
    ch.cancel()
    return got


def test_every_offset_form(channel: BlockingChannel) -> None:
    channel.queue_declare("events", durable=True, arguments=STREAM)
    fill(channel, "events", 10)
    everything = [(n, b"m%d" % n) for n in range(10)]
    assert read(channel, "events", "first") == everything
    assert read(channel, "events", "last") == everything[-1:]
    assert read(channel, "events", 4) == everything[4:]
    assert read(channel, "events", 10_000) == []  # clamped to the end
    assert read(channel, "events", "1h") == everything  # everything within the last hour
    past = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(minutes=5)
    assert read(channel, "events", past) == everything
    future = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(minutes=5)
    assert read(channel, "events", future) == []


def test_timestamp_seek_finds_the_first_message_at_or_after_it(channel: BlockingChannel) -> None:
    channel.queue_declare("timed", durable=True, arguments=STREAM)
    fill(channel, "timed", 3)
    time.sleep(1.1)  # AMQP timestamps are whole seconds
    middle = datetime.datetime.now(tz=datetime.UTC)
    time.sleep(1.1 - middle.microsecond / 1e6)
    fill(channel, "timed", 3, start=3)
    assert [n for n, _ in read(channel, "timed", middle.replace(microsecond=0))] == [3, 4, 5]


def test_next_delivers_only_new_messages(channel: BlockingChannel) -> None:
    channel.queue_declare("live", durable=True, arguments=STREAM)
    fill(channel, "live", 3)
    channel.basic_qos(prefetch_count=10)
    received: list[bytes] = []
    channel.basic_consume("live", lambda ch, m, p, body: received.append(body))  # default: next
    channel.connection.process_data_events(time_limit=0.2)
    assert received == []
    fill(channel, "live", 2, start=3)
    deadline = time.monotonic() + 5
    while len(received) < 2 and time.monotonic() < deadline:
        channel.connection.process_data_events(time_limit=0.05)
    assert received == [b"m3", b"m4"]


def test_reading_removes_nothing_and_readers_are_independent(
    tqbroker_thread: RunningBroker,
) -> None:
    connections = [pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url)) for _ in "ab"]
    first, second = (c.channel() for c in connections)
    first.queue_declare("shared", durable=True, arguments=STREAM)
    fill(first, "shared", 5)
    assert [n for n, _ in read(first, "shared", "first")] == [0, 1, 2, 3, 4]
    assert [n for n, _ in read(second, "shared", 2)] == [2, 3, 4]
    assert [n for n, _ in read(first, "shared", "first")] == [0, 1, 2, 3, 4]
    assert first.queue_declare("shared", passive=True).method.message_count == 5
    for connection in connections:
        connection.close()


def test_prefetch_is_credit(channel: BlockingChannel) -> None:
    """Acks act as credit: a consumer with prefetch 2 gets two, then one more per ack."""
    channel.queue_declare("credit", durable=True, arguments=STREAM)
    fill(channel, "credit", 5)
    channel.basic_qos(prefetch_count=2)
    received: list[tuple[int, int]] = []
    channel.basic_consume(
        "credit",
        lambda ch, m, p, body: received.append((m.delivery_tag, p.headers["x-stream-offset"])),
        arguments={"x-stream-offset": "first"},
    )
    channel.connection.process_data_events(time_limit=0.3)
    assert [offset for _, offset in received] == [0, 1]
    channel.basic_ack(received[0][0])
    channel.connection.process_data_events(time_limit=0.3)
    assert [offset for _, offset in received] == [0, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "arguments", "text"),
    [
        ({"durable": False}, {}, "invalid property 'non-durable'"),
        ({"durable": True, "exclusive": True}, {}, "invalid property 'exclusive-owner'"),
        ({"durable": True, "auto_delete": True}, {}, "invalid property 'auto-delete'"),
        ({"durable": True}, {"x-message-ttl": 1000}, "invalid arg 'x-message-ttl'"),
        ({"durable": True}, {"x-max-age": "forever"}, "invalid arg 'x-max-age'"),
        (
            {"durable": True},
            {"x-stream-max-segment-size-bytes": 100},
            "invalid arg 'x-stream-max-segment-size-bytes'",
        ),
    ],
)
def test_declare_rules(
    channel: BlockingChannel, kwargs: dict[str, bool], arguments: dict[str, Any], text: str
) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("bad-stream", arguments={**STREAM, **arguments}, **kwargs)
    assert closed.value.reply_code == 406
    assert text in closed.value.reply_text


def test_consumer_rules(tqbroker_thread: RunningBroker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    ch = connection.channel()
    ch.queue_declare("rules", durable=True, arguments=STREAM)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.basic_consume("rules", lambda *_args: None)  # no basic.qos
    assert closed.value.reply_code == 406
    assert "consumer prefetch count is not set" in closed.value.reply_text
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.basic_consume("rules", lambda *_args: None, arguments={"x-stream-offset": "soon"})
    assert closed.value.reply_code == 406
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as gone:
        ch.basic_consume("rules", lambda *_args: None, auto_ack=True)
    assert gone.value.reply_code == 540
    assert "automatic acknowledgement not supported" in gone.value.reply_text
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as gone:
        connection.channel().basic_get("rules")
    assert gone.value.reply_code == 540


def test_any_exchange_routes_into_a_stream(channel: BlockingChannel) -> None:
    channel.exchange_declare("logs", "topic")
    channel.queue_declare("audit", durable=True, arguments=STREAM)
    channel.queue_bind("audit", "logs", "app.#")
    channel.confirm_delivery()
    channel.basic_publish("logs", "app.login", b"alice")
    channel.basic_publish("logs", "other", b"ignored", mandatory=False)
    got = read(channel, "audit", "first")
    assert got == [(0, b"alice")]


def test_retention_by_size_drops_whole_old_segments(channel: BlockingChannel) -> None:
    mib = 1024 * 1024
    args = {**STREAM, "x-max-length-bytes": 2 * mib, "x-stream-max-segment-size-bytes": mib}
    channel.queue_declare("bounded-stream", durable=True, arguments=args)
    channel.confirm_delivery()
    for n in range(200):  # ~6 MB in segments of 1 MiB (~34 messages each)
        channel.basic_publish("", "bounded-stream", b"%04d" % n + b"." * 30_000)

    def retained() -> list[int]:
        """retention (in the stream's actor) to drop the oldest segments"""
        offsets = [n for n, _ in read(channel, "bounded-stream", "first")]
        return offsets if offsets and offsets[0] > 0 else []

    offsets = eventually(retained, interval=0.1)
    assert offsets[-1] == 199
    assert offsets == list(range(offsets[0], 200))  # a contiguous tail...
    assert 0 < offsets[0] < 150  # ...of at least 2 MiB, old segments gone


def test_stream_survives_a_restart_with_its_offsets() -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        config = BrokerConfig(port=0, data_dir=Path(data_dir))
        with running_broker(config) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = connection.channel()
            ch.queue_declare("kept", durable=True, arguments=STREAM)
            fill(ch, "kept", 5)
            connection.close()
        with running_broker(config) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = connection.channel()
            fill(ch, "kept", 2, start=5)
            assert read(ch, "kept", "first") == [(n, b"m%d" % n) for n in range(7)]
            connection.close()


@pytest.mark.parametrize(
    "offset",
    ["first", "last", "next", 3, "1h", "timestamp"],
)
def test_aio_pika_reads_a_stream(tqbroker_thread: RunningBroker, offset: Any) -> None:
    """aio-pika, as RabbitMQ's stream docs show it: qos, then consume with x-stream-offset."""
    expected = {
        "first": [0, 1, 2, 3, 4],
        "last": [4],
        "next": [5],
        3: [3, 4],
        "1h": [0, 1, 2, 3, 4],
    }

    async def main() -> None:
        async with await aio_pika.connect(tqbroker_thread.url) as connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=10)
            stream = f"aio-{offset}"
            queue = await channel.declare_queue(stream, durable=True, arguments=STREAM)
            for n in range(5):
                await channel.default_exchange.publish(aio_pika.Message(b"m%d" % n), stream)
            start: Any = offset
            if offset == "timestamp":
                start = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(minutes=1)
            offsets: list[int] = []
            want = expected.get(offset, [0, 1, 2, 3, 4])
            complete = asyncio.Event()

            async def on_message(message: AbstractIncomingMessage) -> None:
                offsets.append(message.headers["x-stream-offset"])  # type: ignore[arg-type]
                await message.ack()
                if len(offsets) >= len(want):
                    complete.set()

            await queue.consume(on_message, arguments={"x-stream-offset": start})
            if offset == "next":
                await asyncio.sleep(0.2)
                await channel.default_exchange.publish(aio_pika.Message(b"m5"), stream)
            await asyncio.wait_for(complete.wait(), 5)
            await asyncio.sleep(0.1)  # nothing more arrives
            assert offsets == want

    asyncio.run(asyncio.wait_for(main(), 20))


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-stream-automatic-offset-tracking": True, "x-stream-offset": "first"},
        {"x-stream-offset": None},
    ],
    ids=["automatic-tracking", "null-offset"],
)
@pytest.mark.parametrize("multiple", [False, True], ids=["acks", "one-multiple-ack"])
def test_server_side_offset_tracking_resumes_after_the_last_ack(
    arguments: dict[str, Any], multiple: bool
) -> None:
    """LavinMQ-compatible: a consumer with a tag that asks for tracking resumes, after a
    reconnect or a broker restart, right after the last message it acked (one ack each, or
    one ``multiple`` ack for them all)."""
    with tempfile.TemporaryDirectory() as data_dir:
        config = BrokerConfig(port=0, data_dir=Path(data_dir))
        with running_broker(config) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = connection.channel()
            ch.queue_declare("tracked", durable=True, arguments=STREAM)
            fill(ch, "tracked", 10)
            ch.basic_qos(prefetch_count=10)
            seen = []
            for method, properties, _body in ch.consume(
                "tracked", arguments=arguments, consumer_tag="reader-1", inactivity_timeout=1
            ):
                assert method is not None
                seen.append(properties.headers["x-stream-offset"])
                if len(seen) == 4 and multiple:
                    ch.basic_ack(method.delivery_tag, multiple=True)  # 0..3 processed
                elif len(seen) <= 4 and not multiple:
                    ch.basic_ack(method.delivery_tag)  # 0..3 processed; 4 delivered, not acked
                if len(seen) == 5:
                    break
            assert seen == [0, 1, 2, 3, 4]
            connection.close()  # the unacked one is not "processed"
            eventually(lambda: stored_offset(broker, "tracked", "reader-1") == 4)
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            assert read_tracked(connection.channel(), arguments, limit=2) == [4, 5]
            connection.close()
            eventually(lambda: stored_offset(broker, "tracked", "reader-1") == 6)
        with running_broker(config) as broker:  # and across a restart
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            assert read_tracked(connection.channel(), arguments, limit=10) == [6, 7, 8, 9]
            connection.close()


def stored_offset(broker: RunningBroker, stream: str, consumer_tag: str) -> int | None:
    """The next offset the stream has stored for a tracked consumer (None: none yet)."""
    assert broker.broker is not None
    queue = broker.broker.vhosts["/"].queues[stream]
    return queue.partition.tracked_offsets.get(consumer_tag)  # type: ignore[attr-defined]


def read_tracked(ch: BlockingChannel, arguments: dict[str, Any], *, limit: int) -> list[int]:
    ch.basic_qos(prefetch_count=10)
    seen: list[int] = []
    for method, properties, _body in ch.consume(
        "tracked", arguments=arguments, consumer_tag="reader-1", inactivity_timeout=0.5
    ):
        if method is None:
            break
        seen.append(properties.headers["x-stream-offset"])
        ch.basic_ack(method.delivery_tag)
        if len(seen) == limit:
            break
    ch.cancel()
    return seen
