"""A lean raw-socket AMQP 0-9-1 client for the benchmarks (our own codec), so that what they
measure is the broker rather than a client library. It costs about a microsecond of client CPU
per message, so a single Python process can drive a broker at 100k+ msg/s.

Responsibilities:
- ``Endpoint``: where a broker listens and how to log in, parsed from an ``amqp://`` URL;
- ``RawClient``: one TCP connection (``TCP_NODELAY``), the handshake (PLAIN, heartbeats off) and
  one channel; synchronous setup calls (declare queues, streams and exchanges, bind, delete,
  passive message counts) that decode the broker's reply and raise ``BrokerError`` when the
  broker closes the channel or the connection;
- the hot paths, with each message's frames (method, content header, body) encoded once and
  sent many at a time in one ``sendall``: publishing without confirms, confirmed publishing
  with a window of unconfirmed messages, consuming with prefetch and ``multiple`` acks, and
  reading a timestamp stamped into each body (end-to-end latency). Received bytes are walked
  frame by frame by offset in one buffer, without an object per frame.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse
from array import array
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.frames import (
    FRAME_HEAD,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    encode_method,
    write_content,
)
from tqbroker.protocol.methods import (
    BasicAck,
    BasicConsume,
    BasicProperties,
    BasicPublish,
    BasicQos,
    ChannelClose,
    ChannelOpen,
    ConfirmSelect,
    ConnectionClose,
    ConnectionOpen,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ExchangeDeclare,
    ExchangeDelete,
    Method,
    QueueBind,
    QueueDeclare,
    QueueDeclareOk,
    QueueDelete,
    decode_method,
)

RECV_SIZE = 1 << 18
FRAME_MAX = 131072
CHANNEL = 1

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK_TAIL = struct.Struct(">QB")  # basic.ack: delivery tag, multiple bit
_STAMP = struct.Struct("<q")  # perf_counter_ns() in the first 8 bytes of a latency body

# Class and method ids as one big-endian u32, as they start a method frame's payload.
_BASIC_DELIVER = 0x003C003C
_BASIC_ACK = 0x003C0050
_BASIC_NACK = 0x003C0078
_CHANNEL_CLOSE = 0x00140028
_CONNECTION_CLOSE = 0x000A0032
_FATAL = (_CHANNEL_CLOSE, _CONNECTION_CLOSE)


M = TypeVar("M", bound=Method)


class BrokerError(Exception):
    """The broker closed the channel or the connection (the reply text says why), or nacked."""


@dataclass(frozen=True)
class Endpoint:
    """Where a broker listens and how to log in (picklable: worker processes get one)."""

    host: str = "127.0.0.1"
    port: int = 5672
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        """``amqp://user:password@host:port/vhost`` (the vhost percent-encoded, ``/`` when
        the path is empty, as in RabbitMQ's URI spec)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "amqp":
            raise ValueError(f"not an amqp:// URL: {url!r}")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5672,
            user=urllib.parse.unquote(parts.username or "guest"),
            password=urllib.parse.unquote(parts.password or "guest"),
            vhost=urllib.parse.unquote(path) if path else "/",
        )

    @property
    def url(self) -> str:
        vhost = urllib.parse.quote(self.vhost, safe="")
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.port}/{vhost}"


def publish_frames(
    routing_key: str, body: bytes, *, exchange: str = "", persistent: bool = False
) -> bytes:
    """One message as the bytes a publisher sends: ``basic.publish``, content header, body."""
    properties = BasicProperties(delivery_mode=2 if persistent else 1).encode()
    out = bytearray(
        encode_method(CHANNEL, BasicPublish(exchange=exchange, routing_key=routing_key))
    )
    write_content(out, CHANNEL, properties, body, FRAME_MAX)
    return bytes(out)


class RawClient:
    """One connection with one open channel (number 1). Not thread-safe; one per process."""

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        *,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        timeout: float | None = 60.0,
    ) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self._confirming = False
        self._published = 0  # messages published on the channel since confirm.select
        self._qos: int | None = None
        self.sock.sendall(PROTOCOL_HEADER)
        start = self._expect_method(ConnectionStart)
        self.server_properties: FieldTable = start.server_properties
        self.send(0, ConnectionStartOk({}, "PLAIN", f"\0{user}\0{password}", "en_US"))
        tune = self._expect_method(ConnectionTune)
        channel_max = tune.channel_max or 2047
        self.send(0, ConnectionTuneOk(channel_max, min(tune.frame_max or FRAME_MAX, FRAME_MAX), 0))
        self.send(0, ConnectionOpen(vhost))
        self.read_method()
        self.send(CHANNEL, ChannelOpen())
        self.read_method()

    @classmethod
    def connect(cls, endpoint: Endpoint, *, timeout: float | None = 60.0) -> RawClient:
        return cls(
            endpoint.port,
            endpoint.host,
            user=endpoint.user,
            password=endpoint.password,
            vhost=endpoint.vhost,
            timeout=timeout,
        )

    @property
    def server_version(self) -> str:
        """``product version`` from the server properties of ``connection.start``."""
        product = self.server_properties.get("product", "?")
        version = self.server_properties.get("version", "?")
        return f"{_text(product)} {_text(version)}"

    # -- frames -----------------------------------------------------------------------------

    def send(self, channel: int, method: Method) -> None:
        self.sock.sendall(encode_method(channel, method))

    def _receive(self) -> bytes:
        """The next bytes from the broker (``ConnectionError`` once it closed the connection)."""
        chunk = self.sock.recv(RECV_SIZE)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        return chunk

    def _refused(self, pos: int) -> NoReturn:
        """The method frame at ``pos`` of the buffer closes the channel or the connection, or
        nacks a publish: raise ``BrokerError`` saying so."""
        del self.buf[:pos]
        self.read_method()  # raises for a close
        raise BrokerError("the broker nacked a publish")

    def read_replies(self, count: int, reply_index: int) -> None:
        """Read until ``count`` method frames whose class and method ids are ``reply_index``
        arrived (the replies to pipelined calls); a close or a nack raises ``BrokerError``."""
        buf, head, u32 = self.buf, FRAME_HEAD, _U32
        seen = 0
        while seen < count:
            buf += self._receive()
            pos, end = 0, len(buf)
            while pos + 7 <= end:
                frame_type, _channel, length = head.unpack_from(buf, pos)
                if pos + 8 + length > end:
                    break
                if frame_type == FRAME_METHOD:
                    ids = u32.unpack_from(buf, pos + 7)[0]
                    if ids == reply_index:
                        seen += 1
                    elif ids in _FATAL:
                        self._refused(pos)
                pos += 8 + length
            del buf[:pos]

    def read_frame(self) -> tuple[int, bytes]:
        """The next frame: its type and payload."""
        buf = self.buf
        while True:
            if len(buf) >= 7:
                frame_type, _channel, size = FRAME_HEAD.unpack_from(buf, 0)
                if len(buf) >= 8 + size:
                    payload = bytes(buf[7 : 7 + size])
                    del buf[: 8 + size]
                    return frame_type, payload
            self.buf += self._receive()

    def read_method(self) -> Method:
        """The next method frame, decoded (content and heartbeat frames before it are skipped);
        ``BrokerError`` if it closes the channel or the connection."""
        while True:
            frame_type, payload = self.read_frame()
            if frame_type != FRAME_METHOD:
                continue
            method = decode_method(memoryview(payload))
            if isinstance(method, ChannelClose | ConnectionClose):
                raise BrokerError(f"{method.NAME}: {method.reply_code} {method.reply_text}")
            return method

    def _expect_method(self, kind: type[M]) -> M:
        method = self.read_method()
        if not isinstance(method, kind):
            raise BrokerError(f"expected {kind.NAME}, got {method.NAME}")
        return method

    def call(self, method: Method) -> Method:
        """Send a synchronous method on the channel and return the broker's reply."""
        self.send(CHANNEL, method)
        return self.read_method()

    # -- setup -------------------------------------------------------------------------------

    def declare(
        self,
        queue: str,
        arguments: FieldTable | None = None,
        *,
        durable: bool = True,
        passive: bool = False,
    ) -> int:
        """Declare a queue (a stream with ``{"x-queue-type": "stream"}``); its message count."""
        self.send(
            CHANNEL,
            QueueDeclare(queue=queue, durable=durable, passive=passive, arguments=arguments or {}),
        )
        return self._expect_method(QueueDeclareOk).message_count

    def message_count(self, queue: str) -> int:
        """The queue's ready messages (a passive ``queue.declare``)."""
        return self.declare(queue, passive=True)

    def wait_for_count(self, queue: str, count: int, *, timeout: float = 600.0) -> float:
        """Poll the message count until it reaches ``count``; the ``perf_counter()`` when it did.
        (A broker may route published messages to a queue after replying to later methods.)"""
        deadline = time.perf_counter() + timeout
        while (have := self.message_count(queue)) < count:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{queue!r} holds {have} messages, not {count}")
            time.sleep(0.001)
        return time.perf_counter()

    def exchange_declare(self, exchange: str, kind: str, *, durable: bool = False) -> None:
        self.call(ExchangeDeclare(exchange=exchange, type=kind, durable=durable))

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        self.call(QueueBind(queue=queue, exchange=exchange, routing_key=routing_key))

    def delete_queue(self, queue: str) -> None:
        self.call(QueueDelete(queue=queue))

    def delete_exchange(self, exchange: str) -> None:
        self.call(ExchangeDelete(exchange=exchange))

    def confirm_select(self) -> None:
        if not self._confirming:
            self.call(ConfirmSelect())
            self._confirming = True

    def qos(self, prefetch: int) -> None:
        if self._qos != prefetch:
            self.call(BasicQos(prefetch_count=prefetch))
            self._qos = prefetch

    def subscribe(
        self,
        queue: str,
        *,
        prefetch: int = 1000,
        arguments: FieldTable | None = None,
        tag: str = "bench",
    ) -> None:
        """``basic.qos`` and ``basic.consume`` (manual acks); deliveries may follow at once."""
        self.qos(prefetch)
        self.call(BasicConsume(queue=queue, consumer_tag=tag, arguments=arguments or {}))

    def close(self, timeout: float = 5.0) -> None:
        """Close the connection politely (best effort: a dead broker is not an error here),
        waiting up to ``timeout`` seconds for ``close-ok``."""
        try:
            self.sock.settimeout(timeout)
            self.send(0, ConnectionClose(200, "bye", 0, 0))
            while self.read_frame()[0] != FRAME_METHOD:
                pass
        except (OSError, ConnectionError, BrokerError):
            pass
        finally:
            self.sock.close()

    # -- hot paths ---------------------------------------------------------------------------

    def publish(self, frames: bytes, count: int, *, batch: int = 256) -> None:
        """Send ``count`` copies of one message's ``frames`` (see ``publish_frames``), ``batch``
        per ``sendall``, without waiting for anything."""
        blob = memoryview(frames * min(batch, max(count, 1)))
        size = len(frames)
        sent = 0
        while sent < count:
            burst = min(batch, count - sent)
            self.sock.sendall(blob[: burst * size])
            sent += burst
        if self._confirming:
            self._published += count

    def publish_confirmed_frames(self, frames: bytes, count: int, *, window: int = 256) -> None:
        """Send ``count`` copies of ``frames`` keeping at most ``window`` unconfirmed; return
        once all are confirmed (``BrokerError`` on a nack)."""
        self.confirm_select()
        size = len(frames)
        blob = memoryview(frames * min(window, max(count, 1)))
        sock, buf, head, u32, ack_tail = self.sock, self.buf, FRAME_HEAD, _U32, _ACK_TAIL
        sent = confirmed = 0
        base = self._published  # confirm tags count the channel's publishes from 1
        while confirmed < count:
            burst = min(window - (sent - confirmed), count - sent)
            if burst > 0:
                sock.sendall(blob[: burst * size])
                sent += burst
            buf += self._receive()
            pos, end = 0, len(buf)
            while pos + 7 <= end:
                frame_type, _channel, length = head.unpack_from(buf, pos)
                if pos + 8 + length > end:
                    break
                if frame_type == FRAME_METHOD:
                    ids = u32.unpack_from(buf, pos + 7)[0]
                    if ids == _BASIC_ACK:
                        tag, multiple = ack_tail.unpack_from(buf, pos + 11)
                        tag -= base
                        confirmed = tag if multiple & 1 else max(confirmed, tag)
                    elif ids == _BASIC_NACK or ids in _FATAL:
                        self._refused(pos)
                pos += 8 + length
            del buf[:pos]
        self._published += count

    def publish_confirmed(
        self,
        queue: str,
        body: bytes,
        count: int,
        *,
        window: int = 256,
        persistent: bool = True,
        exchange: str = "",
    ) -> float:
        """Publish ``count`` messages keeping ``window`` unconfirmed; return msg/s."""
        frames = publish_frames(queue, body, exchange=exchange, persistent=persistent)
        self.confirm_select()
        start = time.perf_counter()
        self.publish_confirmed_frames(frames, count, window=window)
        return count / (time.perf_counter() - start)

    def receive(self, count: int, *, ack_every: int = 100, stamps: array[int] | None = None) -> int:
        """Receive ``count`` deliveries on the channel, acking with ``multiple`` every
        ``ack_every`` deliveries and after the last. With ``stamps``, append each delivery's
        latency in ns: the time its bytes arrived minus the ``perf_counter_ns()`` stamped in
        the first 8 bytes of its body (``stamp_offset``). Returns the last delivery tag."""
        sock, buf, head, u32, u64 = self.sock, self.buf, FRAME_HEAD, _U32, _U64
        received = unacked = 0
        last_tag = 0
        want_body = False
        arrived = 0
        stamp = _STAMP.unpack_from
        while received < count:
            chunk = self._receive()
            if stamps is not None:
                arrived = time.perf_counter_ns()
            buf += chunk
            pos, end = 0, len(buf)
            while pos + 7 <= end:
                frame_type, _channel, length = head.unpack_from(buf, pos)
                if pos + 8 + length > end:
                    break
                if frame_type == FRAME_METHOD:
                    ids = u32.unpack_from(buf, pos + 7)[0]
                    if ids == _BASIC_DELIVER:
                        received += 1
                        unacked += 1
                        want_body = stamps is not None
                        if unacked >= ack_every or received == count:
                            tag_at = pos + 12 + buf[pos + 11]  # after the consumer tag
                            last_tag = u64.unpack_from(buf, tag_at)[0]
                            sock.sendall(encode_method(CHANNEL, BasicAck(last_tag, True)))
                            unacked = 0
                    elif ids in _FATAL:
                        self._refused(pos)
                elif frame_type == 3 and want_body and stamps is not None:
                    stamps.append(arrived - stamp(buf, pos + 7)[0])
                    want_body = False
                pos += 8 + length
            del buf[:pos]
        return last_tag

    def consume(
        self,
        queue: str,
        count: int,
        *,
        prefetch: int = 1000,
        arguments: FieldTable | None = None,
        ack_every: int | None = None,
    ) -> float:
        """Consume ``count`` messages (manual acks, ``multiple`` every ``ack_every``, by default
        half the prefetch); msg/s from ``basic.consume`` to the last delivery."""
        start = time.perf_counter()
        self.subscribe(queue, prefetch=prefetch, arguments=arguments)
        self.receive(count, ack_every=ack_every or max(prefetch // 2, 1))
        return count / (time.perf_counter() - start)


def stamp_offset(frames: bytes, body: bytes) -> int:
    """Where the body starts in ``publish_frames(...)`` output (one body frame at the end)."""
    return len(frames) - 1 - len(body)


def stamp(frames: bytearray, offset: int) -> None:
    """Write ``perf_counter_ns()`` into the body at ``offset`` (see ``RawClient.receive``)."""
    _STAMP.pack_into(frames, offset, time.perf_counter_ns())


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes | bytearray) else str(value)
