"""The server side of an AMQP 0-9-1 connection, sans I/O: bytes in, events out.

Responsibilities:
- the protocol header check;
- frame splitting (``NEED_DATA`` on short input, never an exception), frame sizes checked from the
  frame head before any payload is buffered, frame end markers, frame types;
- the connection state machine (``TRANSITIONS``: start, tune, open, close in both directions) and
  the negotiated limits (channel_max, frame_max, heartbeat);
- channel bookkeeping (open, closing, closed) and content assembly (publish + header + bodies),
  with the message size checked from the content header before any body byte is buffered;
- a fast path for the common case, a buffer holding a whole well-formed publish (``_publish``:
  the three or more frames parsed in one go, the method shared by every publish with the same
  argument bytes); anything else, errors included, takes the frame-by-frame path;
- ``check_properties``/``decode_properties``: a publish's property block validated exactly as
  the decoder would, decoded only when needed, blocks without headers decoded once per distinct
  bytes;
- encoding what the server sends, updating the state as it goes.

Usage, the h11 way::

    conn = ServerConnection(limits)
    conn.receive_data(data)          # b"" at end of stream
    while (event := conn.next_event()) is not NEED_DATA: ...
    sock.send(conn.send_method(0, ConnectionStart(...)))

``next_event`` raises ``AMQPError``: a hard one means "send ``close_connection(err)``", a soft one
"send ``close_channel(err)``"; the error knows its channel. Nothing here imports trio.
"""

from __future__ import annotations

import enum
import struct
from typing import Final, NoReturn

import attrs

from .codec import U64
from .errors import AMQPError, DecodeError, ReplyCode, UnknownMethodError
from .frames import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEAD,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    PROTOCOL_HEADER,
    encode_method,
)
from .methods import (
    BasicProperties,
    BasicPublish,
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ConnectionUpdateSecret,
    Method,
    decode_method,
)


class NeedData(enum.Enum):
    """``next_event`` has nothing complete to return yet."""

    NEED_DATA = enum.auto()


NEED_DATA: Final = NeedData.NEED_DATA


@attrs.frozen
class ProtocolHeaderReceived:
    """The client sent a valid ``AMQP 0-9-1`` header: answer with ``connection.start``."""


@attrs.frozen
class MethodReceived:
    """A method without content (everything except ``basic.publish``)."""

    channel: int
    method: Method


@attrs.define(unsafe_hash=True)
class ContentReceived:
    """A complete ``basic.publish``: the method, the raw property bytes (flags word first, as
    sent, so deliveries can forward them untouched) and the body.

    Read-only by convention, not frozen: a frozen attrs ``__init__`` costs three times as much,
    and one of these is made per published message."""

    channel: int
    method: BasicPublish
    properties: bytes
    body: bytes


@attrs.frozen
class EndOfStream:
    """The peer closed its side of the socket."""


Event = ProtocolHeaderReceived | MethodReceived | ContentReceived | EndOfStream


class BadProtocolHeader(Exception):
    """The first bytes were not ``AMQP 0-9-1``: send ``PROTOCOL_HEADER`` and close the socket."""


class State(enum.Enum):
    AWAIT_HEADER = enum.auto()  # nothing received yet
    HEADER_RECEIVED = enum.auto()  # server must send connection.start
    AWAIT_START_OK = enum.auto()
    AUTHENTICATING = enum.auto()  # server checks credentials, then sends tune (or closes)
    AWAIT_TUNE_OK = enum.auto()
    AWAIT_OPEN = enum.auto()
    OPENING = enum.auto()  # server checks the vhost, then sends open-ok (or closes)
    OPEN = enum.auto()
    CLOSE_RECEIVED = enum.auto()  # peer sent connection.close; server sends close-ok
    CLOSING = enum.auto()  # server sent connection.close; waiting for close-ok
    CLOSED = enum.auto()


# Every state transition of the connection lives in these two tables.
# (state, method received) -> next state
RECEIVE_TRANSITIONS: Final[dict[tuple[State, type[Method]], State]] = {
    (State.AWAIT_START_OK, ConnectionStartOk): State.AUTHENTICATING,
    (State.AWAIT_TUNE_OK, ConnectionTuneOk): State.AWAIT_OPEN,
    (State.AWAIT_OPEN, ConnectionOpen): State.OPENING,
    (State.OPEN, ConnectionUpdateSecret): State.OPEN,
    (State.CLOSING, ConnectionCloseOk): State.CLOSED,
    (State.CLOSING, ConnectionClose): State.CLOSING,
} | {
    (state, ConnectionClose): State.CLOSE_RECEIVED
    for state in (
        State.AWAIT_START_OK,
        State.AUTHENTICATING,
        State.AWAIT_TUNE_OK,
        State.AWAIT_OPEN,
        State.OPENING,
        State.OPEN,
    )
}
# (state, method sent) -> next state; sending connection.close moves any state to CLOSING.
SEND_TRANSITIONS: Final[dict[tuple[State, type[Method]], State]] = {
    (State.HEADER_RECEIVED, ConnectionStart): State.AWAIT_START_OK,
    (State.AUTHENTICATING, ConnectionTune): State.AWAIT_TUNE_OK,
    (State.OPENING, ConnectionOpenOk): State.OPEN,
    (State.CLOSE_RECEIVED, ConnectionCloseOk): State.CLOSED,
    (State.CLOSING, ConnectionCloseOk): State.CLOSING,
}


# Looked up once (an enum member lookup costs more than a global's, on the hot path).
_AWAIT_HEADER: Final = State.AWAIT_HEADER
_OPEN: Final = State.OPEN

# The largest body size a content header may announce at all (RabbitMQ's ?MAX_MSG_SIZE, 512 MiB):
# beyond it the connection fails with 501, whatever max_message_size allows.
MAX_BODY_SIZE: Final = 512 * 1024 * 1024


@attrs.frozen
class Limits:
    """What the server offers in ``connection.tune`` and enforces."""

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 16 * 1024 * 1024
    # Largest frame accepted before tune-ok (RabbitMQ's initial_frame_max).
    initial_frame_max: int = 8192


class _Channel:
    """Per-channel framing state: open or closing, and the content being assembled."""

    __slots__ = ("body", "body_size", "closing", "method", "properties", "received")

    def __init__(self) -> None:
        self.closing = False
        self.method: BasicPublish | None = None  # a publish waiting for its content
        self.properties: bytes | None = None  # set once the content header arrived
        self.body_size = 0
        self.received = 0
        self.body: list[bytes] = []


class ServerConnection:
    """One client connection, seen from the server."""

    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        self.state = State.AWAIT_HEADER
        # Negotiated in tune-ok; until then the pre-tune limits apply.
        self.channel_max = limits.channel_max
        self.frame_max = limits.frame_max
        self.heartbeat = 0
        self.channels: dict[int, _Channel] = {}
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._broken = False  # framing lost: read nothing more
        self._tuned = False
        # The largest body the publish fast path takes (a larger one is an error, raised by the
        # frame-by-frame path).
        self._fast_body_max = min(limits.max_message_size, MAX_BODY_SIZE)

    # -- input -------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the socket; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._broken:
            return
        self._buf = self._buf[self._pos :] + data if self._pos else self._buf + data
        self._pos = 0

    def next_event(self) -> Event | NeedData:
        """The next complete event, ``NEED_DATA`` when more bytes are needed."""
        while True:
            if self._broken:
                return EndOfStream() if self._eof else NEED_DATA
            state = self.state
            if state is _AWAIT_HEADER:
                return self._read_protocol_header()
            buf, pos = self._buf, self._pos
            if len(buf) - pos < 7:
                return EndOfStream() if self._eof else NEED_DATA
            frame_type, channel, size = FRAME_HEAD.unpack_from(buf, pos)
            if frame_type == FRAME_METHOD and state is _OPEN:
                published = self._publish(buf, pos, channel, size)
                if published is not None:
                    return published
            limit = self.frame_max if self._tuned else self.limits.initial_frame_max
            if limit and size > limit:  # 0: no limit
                self._broken = True
                raise AMQPError(
                    ReplyCode.FRAME_ERROR,
                    f"frame size {size} exceeds the negotiated frame_max {limit}",
                )
            end = pos + 7 + size
            if len(buf) <= end:
                return EndOfStream() if self._eof else NEED_DATA
            if buf[end] != FRAME_END:
                self._broken = True
                raise AMQPError(ReplyCode.FRAME_ERROR, f"invalid frame end marker {buf[end]:#x}")
            self._pos = end + 1
            event = self._handle_frame(frame_type, channel, memoryview(buf)[pos + 7 : end])
            if event is not None:
                return event

    def _publish(self, buf: bytes, pos: int, channel: int, size: int) -> ContentReceived | None:
        """The fast path: a complete, well-formed ``basic.publish`` + content header + body
        frame(s) at ``pos`` on an open channel that owes no content, parsed in one go; None for
        anything else (incomplete, unusual or wrong), which the frame-by-frame path then takes
        from the method frame on, so every error is raised there exactly as without this."""
        ch = self.channels.get(channel)
        if ch is None or ch.closing or ch.method is not None:
            return None
        limit = self.frame_max if self._tuned else self.limits.initial_frame_max
        if limit and size > limit:
            return None
        start = pos + 7
        end = start + size  # the method frame's end marker
        hpos = end + 1  # the content header frame
        n = len(buf)
        if (
            size < 4
            or hpos + 19 > n
            or not buf.startswith(_PUBLISH_ID, start)
            or buf[end] != FRAME_END
        ):
            return None
        args = buf[start + 4 : end]
        method = _PUBLISHES.get(args)
        if method is None:
            try:
                decoded = decode_method(memoryview(buf)[start:end])
            except DecodeError:
                return None
            assert isinstance(decoded, BasicPublish)
            method = decoded
            if len(_PUBLISHES) >= _PUBLISHES_MAX:
                _PUBLISHES.clear()
            _PUBLISHES[args] = method
        kind, hchannel, hsize, class_id, weight, body_size = _HEADER_HEAD.unpack_from(buf, hpos)
        hend = hpos + 7 + hsize
        if (
            kind != FRAME_HEADER
            or hchannel != channel
            or hsize < 14
            or (limit and hsize > limit)
            or hend >= n
            or buf[hend] != FRAME_END
            or class_id != 60
            or weight != 0
            or body_size > self._fast_body_max
        ):
            return None
        bpos = hend + 1
        if body_size == 0:
            body = b""
        else:
            parts: list[bytes] | None = None
            received = 0
            while True:
                if bpos + 7 > n:
                    return None
                kind, bchannel, bsize = FRAME_HEAD.unpack_from(buf, bpos)
                bend = bpos + 7 + bsize
                if (
                    kind != FRAME_BODY
                    or bchannel != channel
                    or (limit and bsize > limit)
                    or bend >= n
                    or buf[bend] != FRAME_END
                ):
                    return None
                received += bsize
                if received == body_size and parts is None:
                    body = buf[bpos + 7 : bend]
                    bpos = bend + 1
                    break
                if received > body_size:
                    return None
                if parts is None:
                    parts = []
                parts.append(buf[bpos + 7 : bend])
                bpos = bend + 1
                if received == body_size:
                    body = b"".join(parts)
                    break
        self._pos = bpos
        return ContentReceived(channel, method, buf[hpos + 19 : hend], body)

    def _read_protocol_header(self) -> Event | NeedData:
        got = self._buf[self._pos : self._pos + 8]
        if got != PROTOCOL_HEADER[: len(got)]:
            self._broken = True
            raise BadProtocolHeader(f"bad protocol header {got!r}")
        if len(got) < 8:
            return EndOfStream() if self._eof else NEED_DATA
        self._pos += 8
        self.state = State.HEADER_RECEIVED
        return ProtocolHeaderReceived()

    def _handle_frame(self, frame_type: int, channel: int, payload: memoryview) -> Event | None:
        if self.state in (State.CLOSING, State.CLOSED) and not _is_connection_close(
            frame_type, channel, payload
        ):
            return None  # after we sent connection.close only close and close-ok count
        if frame_type == FRAME_HEARTBEAT:
            if channel:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}")
            if payload:
                raise AMQPError(ReplyCode.FRAME_ERROR, "heartbeat frame with a payload")
            return None
        if frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            self._broken = True
            raise AMQPError(ReplyCode.FRAME_ERROR, f"unknown frame type {frame_type}")
        if channel == 0:
            if frame_type != FRAME_METHOD:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, "content frame on channel 0")
            return self._connection_method(_decode(payload))
        if self.state is not State.OPEN:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME,
                f"frame on channel {channel} before the connection is open",
            )
        ch = self.channels.get(channel)
        if frame_type == FRAME_METHOD:
            return self._channel_method(channel, ch, payload)
        if ch is None:
            raise AMQPError(
                ReplyCode.CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}"
            )
        if ch.closing:
            return None
        if frame_type == FRAME_HEADER:
            return self._content_header(channel, ch, payload)
        return self._content_body(channel, ch, payload)

    def _connection_method(self, method: Method) -> Event | None:
        if self.state is State.CLOSED:
            return None
        next_state = RECEIVE_TRANSITIONS.get((self.state, type(method)))
        if next_state is None:
            if self.state is State.CLOSING:
                return None  # discard everything but close / close-ok
            # RabbitMQ (rabbit_reader's handle_method0 fallback) answers 504 CHANNEL_ERROR.
            raise AMQPError(
                ReplyCode.CHANNEL_ERROR,
                f"unexpected {method.NAME} in connection state {self.state.name.lower()}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if isinstance(method, ConnectionTuneOk):
            self._tune(method)
        self.state = next_state
        return MethodReceived(0, method)

    def _tune(self, tune_ok: ConnectionTuneOk) -> None:
        ours = self.limits
        # As RabbitMQ's validate_negotiated_integer_value: below the minimum, or above the
        # server's limit, where 0 ("no limit") counts as above any limit the server has.
        if 0 < tune_ok.frame_max < FRAME_MIN_SIZE:
            self._refuse_tune(
                "frame_max", tune_ok.frame_max, "lower than the minimum", FRAME_MIN_SIZE
            )
        for name, value, limit in (
            ("channel_max", tune_ok.channel_max, ours.channel_max),
            ("frame_max", tune_ok.frame_max, ours.frame_max),
        ):
            if limit and not 0 < value <= limit:
                self._refuse_tune(name, value, "higher than the maximum", limit)
        self.channel_max = tune_ok.channel_max or ours.channel_max or 0xFFFF  # 0: no limit
        self.frame_max = tune_ok.frame_max or ours.frame_max
        self.heartbeat = tune_ok.heartbeat
        self._tuned = True

    @staticmethod
    def _refuse_tune(name: str, value: int, relation: str, limit: int) -> NoReturn:
        raise AMQPError(
            ReplyCode.NOT_ALLOWED,
            f"negotiated {name} = {value} is {relation} allowed value ({limit})",
            class_id=10,
            method_id=31,
        )

    def _channel_method(
        self, channel: int, ch: _Channel | None, payload: memoryview
    ) -> Event | None:
        # After we sent channel.close only close and close-ok count (peek the ids first: the rest
        # may be anything, even undecodable) -- and channel.open, which is then a second open
        # (RabbitMQ answers 504).
        if (
            ch is not None
            and ch.closing
            and payload[:4] not in (_CHANNEL_CLOSE_ID, _CHANNEL_CLOSE_OK_ID, _CHANNEL_OPEN_ID)
        ):
            return None
        method = _decode(payload)
        if isinstance(method, ChannelOpen):
            if channel > self.channel_max:
                raise AMQPError(
                    ReplyCode.NOT_ALLOWED,
                    f"number of channels opened ({channel}) has reached the negotiated "
                    f"channel_max ({self.channel_max})",
                    class_id=20,
                    method_id=10,
                )
            if ch is not None:
                raise AMQPError(
                    ReplyCode.CHANNEL_ERROR,
                    f"second 'channel.open' seen on channel {channel}",
                    class_id=20,
                    method_id=10,
                )
            self.channels[channel] = _Channel()
            return MethodReceived(channel, method)
        if ch is None:
            if isinstance(method, ChannelCloseOk):
                return None  # a late close-ok for a channel both sides already closed
            raise AMQPError(
                ReplyCode.CHANNEL_ERROR,
                f"expected 'channel.open' on channel {channel}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if method.CLASS_ID == 10:
            raise AMQPError(
                ReplyCode.COMMAND_INVALID,
                f"{method.NAME} on channel {channel}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if ch.method is not None:
            raise _content_owed(ch.method, ch.properties is not None, method.NAME)
        if isinstance(method, ChannelCloseOk):
            del self.channels[channel]
        elif method.HAS_CONTENT:
            if not isinstance(method, BasicPublish):
                raise AMQPError(
                    ReplyCode.COMMAND_INVALID,
                    f"{method.NAME} is sent by servers only",
                    class_id=method.CLASS_ID,
                    method_id=method.METHOD_ID,
                )
            ch.method = method
            return None
        return MethodReceived(channel, method)

    def _content_header(self, channel: int, ch: _Channel, payload: memoryview) -> Event | None:
        method = ch.method
        if method is None:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        if ch.properties is not None:
            raise _content_owed(method, True, "content header")
        if len(payload) < 14:
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                "content header shorter than 14 bytes",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        class_id = payload[0] << 8 | payload[1]
        weight = payload[2] << 8 | payload[3]
        if class_id != method.CLASS_ID or weight != 0:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME,
                f"expected content header for class {method.CLASS_ID}, got one for class "
                f"{class_id} (weight {weight}) instead",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        (body_size,) = U64.unpack_from(payload, 4)
        if body_size > MAX_BODY_SIZE:
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                f"content body size {body_size} exceeds maximum allowed size {MAX_BODY_SIZE}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if body_size > self.limits.max_message_size:
            ch.method = None
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size "
                f"{self.limits.max_message_size}",
                channel=channel,
                class_id=60,
                method_id=40,
            )
        ch.properties = bytes(payload[12:])
        ch.body_size = body_size
        ch.received = 0
        if body_size == 0:
            return self._content_done(channel, ch, b"")
        return None

    def _content_body(self, channel: int, ch: _Channel, payload: memoryview) -> Event | None:
        if ch.method is None:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        if ch.properties is None:
            raise _content_owed(ch.method, False, "content body")
        received = ch.received + len(payload)
        if received > ch.body_size:
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                "content body frame exceeds remaining content size",
                class_id=ch.method.CLASS_ID,
                method_id=ch.method.METHOD_ID,
            )
        if received == ch.body_size and not ch.body:
            return self._content_done(channel, ch, bytes(payload))
        ch.body.append(bytes(payload))
        ch.received = received
        if received == ch.body_size:
            body = b"".join(ch.body)
            ch.body = []
            return self._content_done(channel, ch, body)
        return None

    @staticmethod
    def _content_done(channel: int, ch: _Channel, body: bytes) -> ContentReceived:
        assert ch.method is not None
        assert ch.properties is not None
        event = ContentReceived(channel, ch.method, ch.properties, body)
        ch.method = ch.properties = None
        return event

    # -- output ------------------------------------------------------------------------------

    def send_method(self, channel: int, method: Method) -> bytes:
        """Encode a method frame, applying what sending it does to the state."""
        if channel == 0:
            if isinstance(method, ConnectionClose):
                self.state = State.CLOSING
            else:
                self.state = SEND_TRANSITIONS.get((self.state, type(method)), self.state)
        elif isinstance(method, ChannelClose):
            ch = self.channels.get(channel)
            if ch is not None:
                ch.closing = True
                ch.method = ch.properties = None
                ch.body = []
        elif isinstance(method, ChannelCloseOk):
            ch = self.channels.get(channel)
            if ch is not None and not ch.closing:
                del self.channels[channel]
        return encode_method(channel, method)

    def close_connection(self, error: AMQPError) -> bytes:
        """``connection.close`` carrying the error."""
        close = ConnectionClose(error.code, error.reply_text, error.class_id, error.method_id)
        return self.send_method(0, close)

    def close_channel(self, error: AMQPError) -> bytes:
        """``channel.close`` carrying a soft error on ``error.channel``."""
        close = ChannelClose(error.code, error.reply_text, error.class_id, error.method_id)
        return self.send_method(error.channel, close)

    @property
    def is_open(self) -> bool:
        return self.state is State.OPEN

    def channel_is_open(self, channel: int) -> bool:
        """True when the channel is open and not closing (so it may receive deliveries)."""
        ch = self.channels.get(channel)
        return ch is not None and not ch.closing


_PUBLISH_ID: Final = BasicPublish.INDEX.to_bytes(4, "big")
# A content header frame's head and its fixed fields: frame type, channel, size; class, weight,
# body size.
_HEADER_HEAD: Final = struct.Struct(">BHIHHQ")
# basic.publish arguments as sent -> the decoded method (frozen, so shared), so that a publisher
# repeating its exchange and routing key costs a dict lookup, not a decode and an object. Bounded:
# emptied when full.
_PUBLISHES: dict[bytes, BasicPublish] = {}
_PUBLISHES_MAX: Final = 1024

_CONNECTION_CLOSE_ID = bytes((0, 10, 0, 50))
_CONNECTION_CLOSE_OK_ID = bytes((0, 10, 0, 51))
_CHANNEL_OPEN_ID = bytes((0, 20, 0, 10))
_CHANNEL_CLOSE_ID = bytes((0, 20, 0, 40))
_CHANNEL_CLOSE_OK_ID = bytes((0, 20, 0, 41))


def _content_owed(method: Method, header_received: bool, got: str) -> AMQPError:
    """505 for a frame that is not the content ``method`` still waits for; like RabbitMQ's
    command assembler, it names the content's method, not the intruder."""
    expected = "content body" if header_received else f"content header for class {method.CLASS_ID}"
    return AMQPError(
        ReplyCode.UNEXPECTED_FRAME,
        f"expected {expected}, got {got} instead",
        class_id=method.CLASS_ID,
        method_id=method.METHOD_ID,
    )


def _is_connection_close(frame_type: int, channel: int, payload: memoryview) -> bool:
    """Whether a frame is ``connection.close``/``close-ok``, judged by the ids alone (the rest
    of a frame the connection discards may be anything, even undecodable)."""
    return (
        frame_type == FRAME_METHOD
        and channel == 0
        and payload[:4] in (_CONNECTION_CLOSE_ID, _CONNECTION_CLOSE_OK_ID)
    )


# -- content-header properties on the publish path ----------------------------------------------

# Property blocks without headers, as sent -> decoded, or None: valid, not decoded yet
# (``check_properties`` found it valid, nobody asked for the decoded properties). Such properties
# hold nothing mutable (strings and integers), so one decoded object serves every message with
# the same bytes. Bounded: emptied when full; only blocks of at most _PROPERTIES_KEY_MAX bytes.
_PROPERTIES: dict[bytes, BasicProperties | None] = {}
_PROPERTIES_MAX: Final = 1024
_PROPERTIES_KEY_MAX: Final = 256

_HEADERS_FLAG: Final = 0x2000
_REPLY_TO_FLAG: Final = 0x0200
_EXPIRATION_FLAG: Final = 0x0100
# Properties a publish must look at (reply-to, expiration), or that need a full decode to be
# validated (headers: a field table), or that ``BasicProperties.decode`` refuses (continuation).
_DECODE_FLAGS: Final = _HEADERS_FLAG | _REPLY_TO_FLAG | _EXPIRATION_FLAG | 0x0001
# The other properties in wire order: flag, width (0: shortstr).
_PLAIN_PROPERTIES: Final = (
    (0x8000, 0),  # content-type
    (0x4000, 0),  # content-encoding
    (0x1000, 1),  # delivery-mode
    (0x0800, 1),  # priority
    (0x0400, 0),  # correlation-id
    (0x0080, 0),  # message-id
    (0x0040, 8),  # timestamp
    (0x0020, 0),  # type
    (0x0010, 0),  # user-id
    (0x0008, 0),  # app-id
    (0x0004, 0),  # cluster-id
)
_UNKNOWN: Final = BasicProperties()  # not in _PROPERTIES
# flags word -> the widths of the properties present, in order.
_PLANS: dict[int, tuple[int, ...]] = {}


def decode_properties(raw: bytes) -> BasicProperties:
    """``BasicProperties.decode`` (same result, same ``DecodeError``), memoised for property
    blocks without headers."""
    if type(raw) is not bytes:  # a bytearray or memoryview from a backend: not a dict key
        return BasicProperties.decode(memoryview(raw))
    properties = _PROPERTIES.get(raw)
    if properties is None:
        properties = BasicProperties.decode(memoryview(raw))
        if properties.headers is None:
            _remember(raw, properties)
    return properties


def _remember(raw: bytes, properties: BasicProperties | None) -> None:
    if len(raw) <= _PROPERTIES_KEY_MAX:
        if len(_PROPERTIES) >= _PROPERTIES_MAX:
            _PROPERTIES.clear()
        _PROPERTIES[raw] = properties


def check_properties(raw: bytes) -> BasicProperties | None:
    """Validate a published property block as ``BasicProperties.decode`` does (the same
    ``DecodeError`` for a bad one), decoding it only when that is cheap or needed: the decoded
    properties when they are memoised or carry headers, reply-to or expiration; otherwise None,
    which means the block is valid and ``decode_properties`` will decode it whenever asked."""
    properties = _PROPERTIES.get(raw, _UNKNOWN)
    if properties is not _UNKNOWN:
        return properties
    if len(raw) >= 2:
        flags = raw[0] << 8 | raw[1]
        if not flags & _DECODE_FLAGS and _plain_properties_valid(raw, flags):
            _remember(raw, None)
            return None
    return decode_properties(raw)  # raises what the decoder says


def _plain_properties_valid(raw: bytes, flags: int) -> bool:
    """Whether ``BasicProperties.decode`` accepts ``raw``, whose flags announce none of
    ``_DECODE_FLAGS``, walking the bytes without building anything. Never True for a block the
    decoder refuses (False may be pessimistic: the caller decodes then)."""
    plan = _PLANS.get(flags)
    if plan is None:
        plan = _PLANS[flags] = tuple(w for flag, w in _PLAIN_PROPERTIES if flags & flag)
    size = len(raw)
    off = 2
    for width in plan:
        if width:
            off += width
            if off > size:
                return False
            continue
        if off >= size:
            return False
        end = off + 1 + raw[off]
        if end > size:
            return False
        text = raw[off + 1 : end]
        if not text.isascii():
            try:
                text.decode()
            except UnicodeDecodeError:
                return False
        off = end
    return True


def _decode(payload: memoryview) -> Method:
    try:
        return decode_method(payload)
    except UnknownMethodError as exc:
        raise AMQPError(ReplyCode.COMMAND_INVALID, str(exc)) from None
    except DecodeError as exc:
        # Name the method that failed to decode, as RabbitMQ does, when the ids are there.
        class_id, method_id = (
            (payload[0] << 8 | payload[1], payload[2] << 8 | payload[3])
            if len(payload) >= 4
            else (0, 0)
        )
        raise AMQPError(
            ReplyCode.FRAME_ERROR, str(exc), class_id=class_id, method_id=method_id
        ) from None


__all__ = [
    "MAX_BODY_SIZE",
    "NEED_DATA",
    "BadProtocolHeader",
    "ContentReceived",
    "EndOfStream",
    "Event",
    "Limits",
    "MethodReceived",
    "NeedData",
    "ProtocolHeaderReceived",
    "ServerConnection",
    "State",
    "check_properties",
    "decode_properties",
]
