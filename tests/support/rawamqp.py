"""A tiny synchronous AMQP 0-9-1 client over a plain socket, for tests that must send what no
well-behaved client would.

It is built on tqbroker's own encoders (``encode_method``, the method classes, ``FRAME_HEAD``,
``PROTOCOL_HEADER``) plus a small frame reader that hands back ``Frame(type, channel, payload)``
and decodes methods with ``decode_method``. Everything is blocking with explicit timeouts; the
``expect_*`` helpers raise ``AssertionError`` with a description of what arrived instead.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Mapping
from typing import TypeVar

import attrs

from tqbroker.protocol.codec import FieldValue
from tqbroker.protocol.frames import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEAD,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    encode_method,
)
from tqbroker.protocol.methods import (
    BasicProperties,
    BasicPublish,
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    Method,
    decode_method,
)

M = TypeVar("M", bound=Method)

DEFAULT_TIMEOUT = 5.0
# After a hard error the broker must drop the socket this soon after our close-ok (or after we
# stay silent): RabbitMQ waits at most 3 s (``?SILENT_CLOSE_DELAY`` / ``?NORMAL_TIMEOUT``).
CLOSE_GRACE = 3.5

CLIENT_CAPABILITIES: dict[str, FieldValue] = {
    "authentication_failure_close": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
    "basic.nack": True,
    "connection.blocked": True,
    "exchange_exchange_bindings": True,
    "per_consumer_qos": True,
}

_CONTENT_HEAD = struct.Struct(">HHQ")  # class id, weight, body size


class SocketClosed(Exception):
    """The peer closed (or reset) the connection."""


@attrs.frozen
class Frame:
    type: int
    channel: int
    payload: bytes

    @property
    def method(self) -> Method | None:
        """The decoded method of a method frame (``None`` for other frame types)."""
        if self.type != FRAME_METHOD:
            return None
        return decode_method(memoryview(self.payload))

    def describe(self) -> str:
        if self.type == FRAME_METHOD:
            try:
                return f"channel {self.channel}: {self.method!r}"
            except Exception as exc:
                return f"channel {self.channel}: undecodable method frame ({exc})"
        names = {FRAME_HEADER: "content header", FRAME_BODY: "content body"}
        name = names.get(self.type, "heartbeat" if self.type == FRAME_HEARTBEAT else "frame")
        return f"channel {self.channel}: {name} (type {self.type}, {len(self.payload)} bytes)"


# -- raw frame builders ------------------------------------------------------------------------


def frame(frame_type: int, channel: int, payload: bytes, *, end: int = FRAME_END) -> bytes:
    """One frame, with whatever type, channel and end marker the test asks for."""
    return FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + bytes((end,))


def method_frame(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    """A method frame from raw ids and raw argument bytes (need not decode)."""
    return frame(FRAME_METHOD, channel, struct.pack(">HH", class_id, method_id) + arguments)


def method_arguments(method: Method) -> bytes:
    """The encoded arguments of ``method`` (to truncate or extend them)."""
    out = bytearray()
    method.encode_arguments(out)
    return bytes(out)


def content_header(
    channel: int,
    body_size: int,
    properties: bytes | None = None,
    *,
    class_id: int = 60,
    weight: int = 0,
) -> bytes:
    """A content header frame; ``properties`` are the raw flags word + properties."""
    if properties is None:
        properties = BasicProperties().encode()
    return frame(
        FRAME_HEADER, channel, _CONTENT_HEAD.pack(class_id, weight, body_size) + properties
    )


def body_frame(channel: int, data: bytes) -> bytes:
    return frame(FRAME_BODY, channel, data)


def heartbeat_frame(channel: int = 0, payload: bytes = b"") -> bytes:
    return frame(FRAME_HEARTBEAT, channel, payload)


# -- the client --------------------------------------------------------------------------------


class RawAMQP:
    """One raw connection. Nothing is sent unless a method of this class is called."""

    def __init__(self, host: str, port: int, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self.closed = False  # we saw EOF / reset
        self.start: ConnectionStart | None = None
        self.tune: ConnectionTune | None = None
        self.frame_max = 131072
        self.heartbeats_received = 0

    def __enter__(self) -> RawAMQP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # -- sending -----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: Method) -> None:
        self.send(encode_method(channel, method))

    def send_frame(
        self, frame_type: int, channel: int, payload: bytes, *, end: int = FRAME_END
    ) -> None:
        self.send(frame(frame_type, channel, payload, end=end))

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes = b"",
        *,
        properties: BasicProperties | None = None,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> None:
        """basic.publish + content header + body frames, in one write."""
        props = (properties or BasicProperties()).encode()
        out = encode_method(channel, BasicPublish(0, exchange, routing_key, mandatory, immediate))
        out += content_header(channel, len(body), props)
        chunk = self.frame_max - 8
        for start in range(0, len(body), chunk):
            out += body_frame(channel, body[start : start + chunk])
        self.send(out)

    # -- receiving ---------------------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        """Read more bytes into the buffer; TimeoutError at the deadline, SocketClosed on EOF."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise
        except (ConnectionResetError, BrokenPipeError) as exc:
            self.closed = True
            raise SocketClosed(f"connection reset: {exc}") from None
        if not data:
            self.closed = True
            raise SocketClosed("EOF")
        self._buf += data

    def recv_exact(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self._buf) < n:
            self._fill(deadline)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def read_frame(self, timeout: float = DEFAULT_TIMEOUT) -> Frame:
        """The next frame, heartbeats included. Raises TimeoutError or SocketClosed."""
        deadline = time.monotonic() + timeout
        while len(self._buf) < 7:
            self._fill(deadline)
        frame_type, channel, size = FRAME_HEAD.unpack_from(self._buf, 0)
        while len(self._buf) < 7 + size + 1:
            self._fill(deadline)
        payload = bytes(self._buf[7 : 7 + size])
        end = self._buf[7 + size]
        del self._buf[: 7 + size + 1]
        if end != FRAME_END:
            raise AssertionError(f"the broker sent a frame with end marker {end:#x}")
        if frame_type == FRAME_HEARTBEAT:
            self.heartbeats_received += 1
        return Frame(frame_type, channel, payload)

    def next_frame(self, timeout: float = DEFAULT_TIMEOUT) -> Frame:
        """The next frame that is not a heartbeat."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.read_frame(max(deadline - time.monotonic(), 0.001))
            if got.type != FRAME_HEARTBEAT:
                return got

    def expect_method(
        self, method_type: type[M], timeout: float = DEFAULT_TIMEOUT, *, channel: int | None = None
    ) -> M:
        """The next non-heartbeat frame must be a ``method_type`` (on ``channel`` if given)."""
        try:
            got = self.next_frame(timeout)
        except TimeoutError:
            raise AssertionError(
                f"expected {method_type.NAME}, got nothing within {timeout}s"
            ) from None
        except SocketClosed as exc:
            raise AssertionError(
                f"expected {method_type.NAME}, the socket closed ({exc})"
            ) from None
        method = got.method
        if not isinstance(method, method_type) or (channel is not None and got.channel != channel):
            raise AssertionError(f"expected {method_type.NAME}, got {got.describe()}")
        return method

    def expect_content(self, channel: int, timeout: float = DEFAULT_TIMEOUT) -> tuple[bytes, bytes]:
        """Content header + body frames following a deliver/get-ok/return: (properties, body)."""
        header = self.next_frame(timeout)
        if header.type != FRAME_HEADER or header.channel != channel:
            raise AssertionError(f"expected a content header, got {header.describe()}")
        _, _, size = _CONTENT_HEAD.unpack_from(header.payload, 0)
        body = b""
        while len(body) < size:
            part = self.next_frame(timeout)
            if part.type != FRAME_BODY or part.channel != channel:
                raise AssertionError(f"expected a content body, got {part.describe()}")
            body += part.payload
        return header.payload[12:], body

    def expect_connection_close(
        self,
        code: int | tuple[int, ...],
        *,
        class_id: int | None = None,
        method_id: int | tuple[int, ...] | None = None,
        close_ok: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> ConnectionClose:
        """The broker must send connection.close with ``code`` (one of ``code``) next; then we
        answer close-ok (unless ``close_ok`` is false) and the socket must close within
        ``CLOSE_GRACE`` seconds."""
        close = self.expect_method(ConnectionClose, timeout, channel=0)
        codes = code if isinstance(code, tuple) else (code,)
        assert close.reply_code in codes, (
            f"expected connection.close {codes}, got {close.reply_code} {close.reply_text!r}"
        )
        _check_ids(close, class_id, method_id)
        if close_ok:
            self.send_method(0, ConnectionCloseOk())
            self.expect_socket_closed(CLOSE_GRACE)
        return close

    def expect_channel_close(
        self,
        channel: int,
        code: int,
        *,
        class_id: int | None = None,
        method_id: int | tuple[int, ...] | None = None,
        close_ok: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> ChannelClose:
        """The broker must send channel.close with ``code`` on ``channel`` next (not a
        connection.close); we answer close-ok unless told not to."""
        try:
            got = self.next_frame(timeout)
        except TimeoutError:
            raise AssertionError(f"expected channel.close {code}, got nothing") from None
        except SocketClosed as exc:
            raise AssertionError(f"expected channel.close {code}, socket closed ({exc})") from None
        method = got.method
        if isinstance(method, ConnectionClose):
            raise AssertionError(
                f"expected channel.close {code} on channel {channel}, got connection.close "
                f"{method.reply_code} {method.reply_text!r} "
                f"(class {method.class_id}, method {method.method_id})"
            )
        if not isinstance(method, ChannelClose) or got.channel != channel:
            raise AssertionError(
                f"expected channel.close {code} on channel {channel}, got {got.describe()}"
            )
        assert method.reply_code == code, (
            f"expected channel.close {code}, got {method.reply_code} {method.reply_text!r}"
        )
        _check_ids(method, class_id, method_id)
        if close_ok:
            self.send_method(channel, ChannelCloseOk())
        return method

    def expect_socket_closed(self, timeout: float = CLOSE_GRACE) -> list[Frame]:
        """The broker must close the socket within ``timeout``; returns the non-heartbeat
        frames that arrived first."""
        deadline = time.monotonic() + timeout
        seen: list[Frame] = []
        try:
            while True:
                got = self.read_frame(max(deadline - time.monotonic(), 0.001))
                if got.type != FRAME_HEARTBEAT:
                    seen.append(got)
        except SocketClosed:
            return seen
        except TimeoutError:
            raise AssertionError(
                f"the broker did not close the socket within {timeout}s; frames seen: "
                f"{[f.describe() for f in seen]}"
            ) from None

    def expect_silent_close(self, timeout: float) -> None:
        """The broker must close the socket within ``timeout`` without sending a frame (not even
        connection.close), as RabbitMQ does before the handshake is complete. Fails as soon as
        a frame other than a heartbeat arrives."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                got = self.read_frame(max(deadline - time.monotonic(), 0.001))
                if got.type != FRAME_HEARTBEAT:
                    raise AssertionError(f"expected a silent close, got {got.describe()}")
        except SocketClosed:
            return
        except TimeoutError:
            raise AssertionError(f"the broker did not close the socket within {timeout}s") from None

    def read_until_closed(self, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        """Every raw byte until the broker closes the socket (TimeoutError if it does not)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._fill(deadline)
        except SocketClosed:
            pass
        except TimeoutError:
            raise AssertionError(
                f"the broker did not close the socket within {timeout}s "
                f"(received {bytes(self._buf)!r})"
            ) from None
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def expect_nothing(self, duration: float) -> None:
        """No frame but heartbeats for ``duration`` seconds (and the socket stays open)."""
        try:
            got = self.next_frame(duration)
        except TimeoutError:
            return
        except SocketClosed as exc:
            raise AssertionError(f"the socket closed ({exc})") from None
        raise AssertionError(f"expected nothing, got {got.describe()}")

    # -- handshake ---------------------------------------------------------------------------

    def send_header(self, header: bytes = PROTOCOL_HEADER) -> None:
        self.send(header)

    def start_ok(
        self,
        user: str = "guest",
        password: str = "guest",
        *,
        mechanism: str = "PLAIN",
        capabilities: Mapping[str, FieldValue] | None = None,
        extra_properties: Mapping[str, FieldValue] | None = None,
    ) -> None:
        """Send connection.start-ok with a PLAIN response and our client properties."""
        caps = dict(CLIENT_CAPABILITIES if capabilities is None else capabilities)
        properties: dict[str, FieldValue] = {
            "product": "tqbroker-tests rawamqp",
            "platform": "Python",
            "capabilities": caps,
        }
        properties.update(extra_properties or {})
        response = f"\0{user}\0{password}"
        self.send_method(0, ConnectionStartOk(properties, mechanism, response, "en_US"))

    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        *,
        vhost: str = "/",
        capabilities: Mapping[str, FieldValue] | None = None,
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int | None = None,
    ) -> None:
        """Header, start-ok (PLAIN), tune-ok (the broker's values unless overridden), open."""
        self.send_header()
        self.start = self.expect_method(ConnectionStart, channel=0)
        self.start_ok(user, password, capabilities=capabilities)
        self.tune = tune = self.expect_method(ConnectionTune, channel=0)
        self.tune_ok(
            tune.channel_max if channel_max is None else channel_max,
            tune.frame_max if frame_max is None else frame_max,
            tune.heartbeat if heartbeat is None else heartbeat,
        )
        self.send_method(0, ConnectionOpen(vhost))
        self.expect_method(ConnectionOpenOk, channel=0)

    def tune_ok(self, channel_max: int, frame_max: int, heartbeat: int) -> None:
        self.send_method(0, ConnectionTuneOk(channel_max, frame_max, heartbeat))
        if frame_max:
            self.frame_max = frame_max

    def open_channel(self, channel: int) -> None:
        self.send_method(channel, ChannelOpen())
        self.expect_method(ChannelOpenOk, channel=channel)

    def call(
        self, channel: int, method: Method, reply: type[M], timeout: float = DEFAULT_TIMEOUT
    ) -> M:
        """Send ``method`` and expect ``reply`` on the same channel."""
        self.send_method(channel, method)
        return self.expect_method(reply, timeout, channel=channel)

    def close_channel(self, channel: int) -> None:
        self.call(channel, ChannelClose(200, "bye", 0, 0), ChannelCloseOk)

    def close_connection(self) -> None:
        """A clean connection.close / close-ok exchange, then the broker must hang up."""
        self.call(0, ConnectionClose(200, "bye", 0, 0), ConnectionCloseOk)
        self.expect_socket_closed(CLOSE_GRACE)


def _check_ids(
    close: ConnectionClose | ChannelClose,
    class_id: int | None,
    method_id: int | tuple[int, ...] | None,
) -> None:
    if class_id is not None:
        assert close.class_id == class_id, (
            f"{close.reply_code} {close.reply_text!r}: expected class_id {class_id}, "
            f"got {close.class_id} (method_id {close.method_id})"
        )
    if method_id is not None:
        ids = method_id if isinstance(method_id, tuple) else (method_id,)
        assert close.method_id in ids, (
            f"{close.reply_code} {close.reply_text!r}: expected method_id {ids}, "
            f"got {close.method_id} (class_id {close.class_id})"
        )


__all__ = [
    "CLIENT_CAPABILITIES",
    "CLOSE_GRACE",
    "Frame",
    "RawAMQP",
    "SocketClosed",
    "body_frame",
    "content_header",
    "frame",
    "heartbeat_frame",
    "method_arguments",
    "method_frame",
]
