"""Incomplete message bodies are bounded: per connection (``max_incomplete_body_per_connection``,
64 MiB by default) and across the broker (a tenth of the memory high watermark). A content
header whose body would pass a cap gets channel.close 406 before any byte of that body is
buffered; the connection, its other channels and every other client go on.

Probe of the issue: one connection, 64 channels, each with a 16 MiB message begun and never
finished, made the broker hold 1.28 GB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.rawamqp import RawAMQP, body_frame, content_header
from tqbroker.protocol.frames import encode_method
from tqbroker.protocol.methods import BasicPublish, QueueDeclare, QueueDeclareOk
from tqbroker.testing import BrokerProcess, start_broker_process

MIB = 1024 * 1024
SIXTEEN_MIB = 16 * MIB


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with start_broker_process(
        tmp_path / "data", extra_args=["--memory-high-watermark", "2GiB"]
    ) as b:
        yield b


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / MIB


def begin(amqp: RawAMQP, channel: int, size: int, sent: int) -> None:
    """Open ``channel`` and begin a ``size``-byte message on it, sending ``sent`` bytes."""
    amqp.open_channel(channel)
    out = bytearray()
    out += _publish(channel) + content_header(channel, size)
    chunk = amqp.frame_max - 8
    for start in range(0, sent, chunk):
        out += body_frame(channel, b"x" * min(chunk, sent - start))
    amqp.send(bytes(out))


def _publish(channel: int) -> bytes:
    return encode_method(channel, BasicPublish(0, "", "q"))


def test_one_connection_cannot_hold_more_than_its_cap_of_incomplete_bodies(
    broker: BrokerProcess,
) -> None:
    before = resident_mib(broker.proc.pid)
    with RawAMQP(broker.host, broker.port) as amqp:
        amqp.handshake()
        amqp.open_channel(100)
        amqp.call(100, QueueDeclare(queue="q"), QueueDeclareOk)
        for channel in range(1, 5):  # 4 x 16 MiB: the cap, 64 MiB
            begin(amqp, channel, SIXTEEN_MIB, 8 * MIB)
        refused = []
        for channel in range(5, 65):
            amqp.open_channel(channel)
            amqp.send(_publish(channel) + content_header(channel, SIXTEEN_MIB))
            close = amqp.expect_channel_close(channel, 406, class_id=60, method_id=40)
            refused.append(channel)
        assert "incomplete message bodies on this connection" in close.reply_text
        assert len(refused) == 60
        # The connection goes on: a channel finishes its message, and its room comes back.
        chunk = amqp.frame_max - 8
        amqp.send(b"".join(body_frame(1, b"y" * chunk) for _ in range(8 * MIB // chunk)))
        amqp.send(body_frame(1, b"y" * (8 * MIB % chunk)))
        declared = amqp.call(100, QueueDeclare(queue="q", passive=True), QueueDeclareOk)
        assert declared.message_count == 1
        begin(amqp, 200, SIXTEEN_MIB, MIB)
        with pytest.raises(TimeoutError):
            amqp.next_frame(timeout=1.0)  # accepted: no close
    grown = resident_mib(broker.proc.pid) - before
    assert grown < 4 * 16 + 64, f"the broker grew by {grown:.0f} MiB"


def test_the_broker_caps_incomplete_bodies_across_connections(tmp_path: Path) -> None:
    """A 400 MiB memory watermark: at most 40 MiB of incomplete bodies across connections
    (a tenth), however many connections begin messages."""
    with start_broker_process(
        tmp_path / "data", extra_args=["--memory-high-watermark", "400MiB"]
    ) as b:
        clients = [RawAMQP(b.host, b.port) for _ in range(4)]
        try:
            for client in clients:
                client.handshake()
            begin(clients[0], 1, SIXTEEN_MIB, MIB)
            begin(clients[1], 1, SIXTEEN_MIB, MIB)  # 32 of 40 MiB
            clients[2].open_channel(1)
            clients[2].send(_publish(1) + content_header(1, SIXTEEN_MIB))
            close = clients[2].expect_channel_close(1, 406)
            assert "incomplete message bodies on the broker" in close.reply_text
            clients[0].close()  # its incomplete message is dropped, its room given back
            for channel in range(1, 100):  # once the broker has seen the close
                begin(clients[3], channel, SIXTEEN_MIB, MIB)
                try:
                    clients[3].expect_channel_close(channel, 406, timeout=0.5)
                except AssertionError:
                    break  # accepted: no close
            else:
                raise AssertionError("the closed connection's room never came back")
        finally:
            for client in clients:
                client.close()
