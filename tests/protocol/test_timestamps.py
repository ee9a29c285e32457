"""Field-table timestamps (``T``, a u64 of seconds) carried as RabbitMQ carries them: any 64-bit
value, also past year 9999 where no ``datetime`` reaches (a ``Timestamp``), decodes and encodes
back byte for byte; over a real connection a header of 2**63 seconds arrives intact and leaves
the connection open, and ``x-stream-offset`` of 2**64 - 1 seconds starts a stream consumer at the
end (after every record), as RabbitMQ does (checked against the oracle when it is installed)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pika
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support.rabbitmq_oracle import RabbitMQ
from tests.support.rawamqp import RawAMQP, body_frame, content_header
from tqbroker.protocol.codec import U64, FieldTable, Timestamp, encode_table, read_table
from tqbroker.protocol.methods import (
    BasicConsume,
    BasicConsumeOk,
    BasicDeliver,
    BasicGet,
    BasicGetOk,
    BasicProperties,
    BasicPublish,
    BasicQos,
    BasicQosOk,
    QueueDeclare,
    QueueDeclareOk,
)
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(60)

BEYOND_9999 = 2**63
LAST = 2**64 - 1


def _table(seconds: int) -> bytes:
    entry = b"\x02ts" + b"T" + U64.pack(seconds)
    return len(entry).to_bytes(4, "big") + entry


@given(st.integers(0, LAST))
@example(0)
@example(253402300799)  # 9999-12-31 23:59:59: the last second a datetime holds
@example(253402300800)
@example(BEYOND_9999)
@example(LAST)
def test_any_u64_timestamp_round_trips_byte_for_byte(seconds: int) -> None:
    wire = _table(seconds)
    table, _ = read_table(memoryview(wire), 0)
    assert encode_table(table) == wire
    value = table["ts"]
    if seconds <= 253402300799:
        assert isinstance(value, datetime.datetime)
        assert value == datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            seconds=seconds
        )
    else:
        assert value == Timestamp(seconds)


def test_a_timestamp_outside_64_bits_is_refused() -> None:
    for seconds in (-1, 2**64):
        with pytest.raises(ValueError, match="unsigned 64-bit"):
            Timestamp(seconds)


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def test_a_header_past_year_9999_is_published_and_consumed_intact(broker: RunningBroker) -> None:
    """The content header built by hand (flags: headers only), as a non-Python client sends
    it; today's decoder once closed the connection with 501 at it."""
    headers = _table(BEYOND_9999)[4:] + b"\x04last" + b"T" + U64.pack(LAST)
    sent = b"\x20\x00" + len(headers).to_bytes(4, "big") + headers
    with RawAMQP(broker.host, broker.port) as client:
        client.handshake()
        client.open_channel(1)
        queue = client.call(1, QueueDeclare(0, "", False, False, True), QueueDeclareOk).queue
        for body in (b"first", b"second"):  # the connection stays open after the first
            client.send_method(1, BasicPublish(0, "", queue, False, False))
            client.send(content_header(1, len(body), sent) + body_frame(1, body))
            client.call(1, BasicGet(0, queue, True), BasicGetOk)
            assert client.expect_content(1) == (sent, body)
        decoded = BasicProperties.decode(memoryview(sent)).headers
        assert decoded == {"ts": Timestamp(BEYOND_9999), "last": Timestamp(LAST)}
        assert BasicProperties(headers=decoded).encode() == sent


def _stream_start_at_the_last_timestamp(host: str, port: int) -> list[bytes]:
    """The bodies a stream consumer with ``x-stream-offset`` T=2**64-1 receives of one record
    published before it and one after."""
    with pika.BlockingConnection(pika.ConnectionParameters(host, port)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare(
            "ts-far-stream", durable=True, arguments={"x-queue-type": "stream"}
        ).method.queue
        channel.basic_publish("", queue, b"before")
        with RawAMQP(host, port) as client:
            client.handshake()
            client.open_channel(1)
            client.call(1, BasicQos(0, 10, False), BasicQosOk)
            arguments: FieldTable = {"x-stream-offset": Timestamp(LAST)}
            consume = BasicConsume(0, queue, "c", False, False, False, False, arguments)
            client.call(1, consume, BasicConsumeOk)
            channel.basic_publish("", queue, b"after")
            bodies = []
            deliver = client.next_frame().method
            assert isinstance(deliver, BasicDeliver), deliver
            bodies.append(client.expect_content(1)[1])
            client.expect_nothing(0.3)
        channel.queue_delete(queue)
    return bodies


def test_x_stream_offset_at_the_last_timestamp_starts_at_the_end(broker: RunningBroker) -> None:
    assert _stream_start_at_the_last_timestamp(broker.host, broker.port) == [b"after"]


@pytest.mark.timeout(300)  # the oracle's start and stop
def test_rabbitmq_starts_there_too(rabbitmq_oracle: RabbitMQ) -> None:
    assert _stream_start_at_the_last_timestamp("127.0.0.1", rabbitmq_oracle.port) == [b"after"]
