"""A lean raw-socket AMQP 0-9-1 client for the benchmarks (our own codec), so that what they
measure is the broker rather than a client library: handshake, confirmed publishing with a window
of unconfirmed messages, and consuming with prefetch and ``multiple`` acks."""

from __future__ import annotations

import socket
import struct
import time

from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.frames import (
    FRAME_BODY,
    FRAME_END_BYTE,
    FRAME_HEAD,
    FRAME_HEADER,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    encode_method,
)
from tqbroker.protocol.methods import (
    BasicAck,
    BasicConsume,
    BasicProperties,
    BasicPublish,
    BasicQos,
    ChannelOpen,
    ConfirmSelect,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTuneOk,
    QueueDeclare,
)

_DELIVER = struct.pack(">HH", 60, 60)
_ACK = struct.pack(">HH", 60, 80)


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(PROTOCOL_HEADER)
        self.read_frame()  # start
        self.send(0, ConnectionStartOk({}, "PLAIN", "\0guest\0guest", "en_US"))
        self.read_frame()  # tune
        self.send(0, ConnectionTuneOk(2047, 131072, 0))
        self.send(0, ConnectionOpen("/"))
        self.read_frame()
        self.send(1, ChannelOpen())
        self.read_frame()
        self._confirming = False

    def send(self, channel: int, method: object) -> None:
        self.sock.sendall(encode_method(channel, method))  # type: ignore[arg-type]

    def read_frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 7:
                frame_type, _channel, size = FRAME_HEAD.unpack_from(self.buf, 0)
                if len(self.buf) >= 8 + size:
                    payload = self.buf[7 : 7 + size]
                    self.buf = self.buf[8 + size :]
                    return frame_type, payload
            chunk = self.sock.recv(262144)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.buf += chunk

    def declare(self, queue: str, arguments: FieldTable | None = None) -> None:
        self.send(1, QueueDeclare(queue=queue, durable=True, arguments=arguments or {}))
        self.read_frame()

    def publish_confirmed(
        self, queue: str, body: bytes, count: int, *, window: int = 256, persistent: bool = True
    ) -> float:
        """Publish ``count`` messages keeping ``window`` unconfirmed; return msg/s."""
        if not self._confirming:
            self.send(1, ConfirmSelect())
            self.read_frame()
            self._confirming = True
        props = BasicProperties(delivery_mode=2 if persistent else 1).encode()
        one = (
            encode_method(1, BasicPublish(exchange="", routing_key=queue))
            + FRAME_HEAD.pack(FRAME_HEADER, 1, 12 + len(props))
            + struct.pack(">HHQ", 60, 0, len(body))
            + props
            + FRAME_END_BYTE
            + FRAME_HEAD.pack(FRAME_BODY, 1, len(body))
            + body
            + FRAME_END_BYTE
        )
        sent = confirmed = 0
        start = time.perf_counter()
        while confirmed < count:
            burst = min(window - (sent - confirmed), count - sent)
            if burst > 0:
                self.sock.sendall(one * burst)
                sent += burst
            _type, payload = self.read_frame()
            if payload[:4] == _ACK:
                tag, multiple = struct.unpack_from(">QB", payload, 4)
                confirmed = tag if multiple & 1 else max(confirmed, tag)
        return count / (time.perf_counter() - start)

    def consume(
        self, queue: str, count: int, *, prefetch: int = 1000, arguments: FieldTable | None = None
    ) -> float:
        """Consume ``count`` messages (manual acks, ``multiple`` every half prefetch); msg/s."""
        self.send(1, BasicQos(prefetch_count=prefetch))
        self.read_frame()
        self.send(1, BasicConsume(queue=queue, consumer_tag="bench", arguments=arguments or {}))
        self.read_frame()
        received = 0
        start = time.perf_counter()
        while received < count:
            frame_type, payload = self.read_frame()
            if frame_type == FRAME_METHOD and payload[:4] == _DELIVER:
                received += 1
                if received % (prefetch // 2) == 0 or received == count:
                    self.send(1, BasicAck(delivery_tag=received, multiple=True))
        return count / (time.perf_counter() - start)
