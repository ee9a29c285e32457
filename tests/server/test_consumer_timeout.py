"""The delivery-acknowledgement timeout runs on Trio's clock: with MockClock, RabbitMQ's 30-minute
default passes in milliseconds. A broker runs in the test's Trio run and a small async client
talks to it over a real loopback socket (loopback data is ready at once, so the autojumping clock
only jumps when both sides are idle). pika scenarios with short timeouts are in
tests/interop/test_queue_features.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.rawamqp import body_frame, content_header
from tqbroker import BrokerConfig
from tqbroker.protocol.frames import FRAME_HEAD, FRAME_METHOD, PROTOCOL_HEADER, encode_method
from tqbroker.protocol.methods import (
    BasicGet,
    BasicGetOk,
    BasicPublish,
    ChannelClose,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    Method,
    QueueDeclare,
    QueueDeclareOk,
    decode_method,
)
from tqbroker.testing import start_broker


class Client:
    """Just enough of an async AMQP client for these tests."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def send(self, channel: int, method: Method) -> None:
        await self.stream.send_all(encode_method(channel, method))

    async def method(self) -> tuple[int, Method]:
        """The next method frame (content frames are skipped)."""
        while True:
            while (
                len(self.buffer) < 7
                or len(self.buffer) < 8 + FRAME_HEAD.unpack_from(self.buffer)[2]
            ):
                data = await self.stream.receive_some(65536)
                assert data, "the broker closed the connection"
                self.buffer += data
            frame_type, channel, size = FRAME_HEAD.unpack_from(self.buffer)
            payload = bytes(self.buffer[7 : 7 + size])
            del self.buffer[: 8 + size]
            if frame_type == FRAME_METHOD:
                return channel, decode_method(memoryview(payload))

    async def expect(self, method_type: type[Method]) -> Method:
        _channel, method = await self.method()
        assert isinstance(method, method_type), method
        return method

    async def open(self) -> None:
        await self.stream.send_all(PROTOCOL_HEADER)
        await self.expect(ConnectionStart)
        await self.send(0, ConnectionStartOk(mechanism="PLAIN", response="\0guest\0guest"))
        tune = await self.expect(ConnectionTune)
        assert isinstance(tune, ConnectionTune)
        await self.send(0, ConnectionTuneOk(tune.channel_max, tune.frame_max, 0))
        await self.send(0, ConnectionOpen("/"))
        await self.expect(ConnectionOpenOk)
        await self.send(1, ChannelOpen())
        await self.expect(ChannelOpenOk)


async def connect(nursery: trio.Nursery, tmp_path: Path, **config: object) -> Client:
    broker = await start_broker(
        nursery,
        BrokerConfig(port=0, data_dir=tmp_path, heartbeat=0, handshake_timeout=1e9, **config),  # type: ignore[arg-type]
    )
    client = Client(await trio.open_tcp_stream(broker.host, broker.port))
    await client.open()
    return client


async def get_unacked(client: Client, queue: str, arguments: dict[str, object]) -> None:
    await client.send(1, QueueDeclare(queue=queue, arguments=arguments))  # type: ignore[arg-type]
    await client.expect(QueueDeclareOk)
    await client.stream.send_all(
        encode_method(1, BasicPublish(routing_key=queue))
        + content_header(1, 3, b"\x00\x00")
        + body_frame(1, b"job")
    )
    await client.send(1, BasicGet(queue=queue, no_ack=False))
    await client.expect(BasicGetOk)


async def test_default_consumer_timeout_is_thirty_minutes(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        client = await connect(nursery, tmp_path)
        await get_unacked(client, "q", {})
        delivered = trio.current_time()
        channel, close = await client.method()
        assert isinstance(close, ChannelClose)
        assert channel == 1
        assert close.reply_code == 406
        assert "Timeout value used: 1800000 ms" in close.reply_text
        assert trio.current_time() - delivered == pytest.approx(30 * 60, abs=0.01)
        nursery.cancel_scope.cancel()


async def test_queue_consumer_timeout_overrides_the_default(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        client = await connect(nursery, tmp_path, consumer_timeout_ms=None)
        await get_unacked(client, "q", {"x-consumer-timeout": 5 * 60 * 1000})
        delivered = trio.current_time()
        _channel, close = await client.method()
        assert isinstance(close, ChannelClose)
        assert close.reply_code == 406
        assert trio.current_time() - delivered == pytest.approx(5 * 60, abs=0.01)
        nursery.cancel_scope.cancel()


async def test_no_timeout_when_disabled(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        client = await connect(nursery, tmp_path, consumer_timeout_ms=None)
        await get_unacked(client, "q", {})
        with trio.move_on_after(2 * 3600) as waited:
            await client.method()
        assert waited.cancelled_caught  # two hours passed without the channel closing
        nursery.cancel_scope.cancel()
