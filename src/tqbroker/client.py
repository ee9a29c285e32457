"""A small blocking AMQP 0-9-1 client on our own codec, for the command line (``produce`` and
``consume`` talk to a running broker with it) and scripts that want no client library.

Responsibilities:
- ``Client``: connect and log in (PLAIN), one channel; synchronous methods wait for their
  ``-ok``; a ``channel.close`` or ``connection.close`` from the broker raises ``ClientError``
  with its reply code and text;
- publishing with publisher confirms (``publish`` + ``wait_for_confirms``);
- consuming: ``consume`` then ``deliveries()`` yields ``Delivery`` records (and ``Cancelled``
  when the broker cancels a consumer, e.g. a consumer group revoking a partition); ``ack``.

It is blocking on purpose: a command-line tool does one thing at a time. Heartbeats are off.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import attrs

from .protocol.codec import FieldTable
from .protocol.frames import (
    FRAME_BODY,
    FRAME_END_BYTE,
    FRAME_HEAD,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    encode_method,
)
from .protocol.methods import (
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicDeliver,
    BasicNack,
    BasicProperties,
    BasicPublish,
    BasicQos,
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ConfirmSelect,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    Method,
    decode_method,
)

_CONTENT_HEAD = struct.Struct(">HHQ")  # class id, weight, body size
CHANNEL = 1


class ClientError(Exception):
    """The broker closed the channel or connection (``code``: its AMQP reply code)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


@attrs.frozen
class Delivery:
    consumer_tag: str
    delivery_tag: int
    exchange: str
    routing_key: str
    properties: BasicProperties
    body: bytes


@attrs.frozen
class Cancelled:
    """The broker cancelled this consumer (``basic.cancel``)."""

    consumer_tag: str


class Client:
    def __init__(
        self, url: str = "amqp://guest:guest@127.0.0.1:5672/", timeout: float = 30
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "amqp":
            # Not the URL itself: it may carry a password.
            raise ValueError(f"not an amqp:// URL (the scheme is {parts.scheme!r})")
        self.sock = socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 5672), timeout
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()
        self._pending: list[tuple[int, bytes]] = []  # frames read while waiting for another
        self._published = 0
        self._confirmed = 0
        self._nacked = False
        self.sock.sendall(PROTOCOL_HEADER)
        self._expect_method()  # connection.start
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        # consumer_cancel_notify: the broker tells us when it cancels a consumer (a group
        # revoking a partition) instead of dropping it silently.
        properties: FieldTable = {
            "product": "tqbroker.client",
            "capabilities": {"consumer_cancel_notify": True},
        }
        self._send(0, ConnectionStartOk(properties, "PLAIN", f"\0{user}\0{password}", "en_US"))
        tune = self._expect_method()
        assert isinstance(tune, ConnectionTune)
        self.frame_max = tune.frame_max or 131072
        self._send(0, ConnectionTuneOk(tune.channel_max, self.frame_max, 0))
        vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        self._send(0, ConnectionOpen(vhost))
        self._expect_method()
        self._call(ChannelOpen())

    # -- publishing ------------------------------------------------------------------------

    def confirm_select(self) -> None:
        self._call(ConfirmSelect())

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: BasicProperties
    ) -> None:
        raw = properties.encode()
        out = bytearray(
            encode_method(CHANNEL, BasicPublish(exchange=exchange, routing_key=routing_key))
        )
        out += FRAME_HEAD.pack(FRAME_HEADER, CHANNEL, 12 + len(raw))
        out += _CONTENT_HEAD.pack(60, 0, len(body)) + raw + FRAME_END_BYTE
        step = self.frame_max - 8
        for start in range(0, len(body), step):
            chunk = body[start : start + step]
            out += FRAME_HEAD.pack(FRAME_BODY, CHANNEL, len(chunk)) + chunk + FRAME_END_BYTE
        self.sock.sendall(out)
        self._published += 1

    def wait_for_confirms(self) -> None:
        """Wait until every publish so far is confirmed; ``ClientError`` if one was nacked."""
        while self._confirmed < self._published:
            method = self._next_method()
            if isinstance(method, BasicAck | BasicNack):
                if isinstance(method, BasicNack):
                    self._nacked = True
                self._confirmed = (
                    method.delivery_tag
                    if method.multiple
                    else max(self._confirmed, method.delivery_tag)
                )
        if self._nacked:
            self._nacked = False
            raise ClientError(0, "the broker refused (nacked) a message")

    # -- consuming -------------------------------------------------------------------------

    def qos(self, prefetch_count: int) -> None:
        self._call(BasicQos(prefetch_count=prefetch_count))

    def consume(self, queue: str, tag: str, arguments: FieldTable | None = None) -> None:
        self._call(BasicConsume(queue=queue, consumer_tag=tag, arguments=arguments or {}))

    def deliveries(self, timeout: float | None = None) -> Iterator[Delivery | Cancelled]:
        """Deliveries and cancellations as they come; stops after ``timeout`` seconds with
        nothing (None: never)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                try:
                    method = self._next_method()
                except TimeoutError:
                    return
                if isinstance(method, BasicCancel):
                    yield Cancelled(method.consumer_tag)
                elif isinstance(method, BasicDeliver):
                    properties, body = self._read_content()
                    yield Delivery(
                        method.consumer_tag,
                        method.delivery_tag,
                        method.exchange,
                        method.routing_key,
                        properties,
                        body,
                    )
        finally:
            self.sock.settimeout(None)

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self._send(CHANNEL, BasicAck(delivery_tag=delivery_tag, multiple=multiple))

    def close(self) -> None:
        try:
            self._send(0, ConnectionClose(200, "bye", 0, 0))
            while not isinstance(self._next_method(), ConnectionCloseOk):
                pass
        except (OSError, ClientError):
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- frames ----------------------------------------------------------------------------

    def _send(self, channel: int, method: Method) -> None:
        self.sock.sendall(encode_method(channel, method))

    def _call(self, method: Method) -> Method:
        """Send a synchronous method and return its reply (deliveries meanwhile are kept)."""
        self._send(CHANNEL, method)
        while True:
            frame = self._read_frame()
            if frame[0] != FRAME_METHOD:
                self._pending.append(frame)
                continue
            reply = self._decode(frame[1])
            if type(reply).__name__ == type(method).__name__ + "Ok":
                return reply
            self._pending.append(frame)

    def _expect_method(self) -> Method:
        return self._next_method()

    def _next_method(self) -> Method:
        while True:
            frame_type, payload = self._pending.pop(0) if self._pending else self._read_frame()
            if frame_type == FRAME_METHOD:
                return self._decode(payload)

    def _decode(self, payload: bytes) -> Method:
        method = decode_method(memoryview(payload))
        if isinstance(method, ConnectionClose):
            self._send(0, ConnectionCloseOk())
            raise ClientError(method.reply_code, method.reply_text)
        if isinstance(method, ChannelClose):
            self._send(CHANNEL, ChannelCloseOk())
            raise ClientError(method.reply_code, method.reply_text)
        return method

    def _read_content(self) -> tuple[BasicProperties, bytes]:
        frame_type, payload = self._pending.pop(0) if self._pending else self._read_frame()
        assert frame_type == FRAME_HEADER
        size = _CONTENT_HEAD.unpack_from(payload, 0)[2]
        properties = BasicProperties.decode(memoryview(payload)[12:])
        body = bytearray()
        while len(body) < size:
            frame_type, chunk = self._pending.pop(0) if self._pending else self._read_frame()
            assert frame_type == FRAME_BODY
            body += chunk
        return properties, bytes(body)

    def _read_frame(self) -> tuple[int, bytes]:
        buffer = self._buffer
        while True:
            if len(buffer) >= 7:
                frame_type, _channel, size = FRAME_HEAD.unpack_from(buffer, 0)
                if len(buffer) >= 8 + size:
                    payload = bytes(buffer[7 : 7 + size])
                    del buffer[: 8 + size]
                    if frame_type == FRAME_HEARTBEAT:
                        continue
                    return frame_type, payload
            chunk = self.sock.recv(262144)
            if not chunk:
                raise ClientError(0, "the broker closed the connection")
            buffer += chunk
