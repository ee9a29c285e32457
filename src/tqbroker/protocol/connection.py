"""The server side of an AMQP 0-9-1 connection, sans I/O: bytes in, events out.

Responsibilities:
- the protocol header check;
- dispatching each frame (split by ``_framing``) by type and channel; the publish fast path
  (``_fastpath``) tried first on an open connection; anything else, errors included, takes the
  frame-by-frame path;
- applying the state tables of ``_state`` to what is received and sent, and the checks around
  them: tune negotiation (channel_max, frame_max, heartbeat), channel numbers, methods in the
  wrong class or during content;
- encoding what the server sends, updating the state as it goes (an illegal send raises
  ``LocalProtocolError``).

Usage, the h11 way::

    conn = ServerConnection(limits)
    conn.receive_data(data)          # b"" at end of stream
    while (event := conn.next_event()) is not NEED_DATA: ...
    sock.send(conn.send_method(0, ConnectionStart(...)))

``next_event`` raises ``AMQPError``: a hard one means "send ``close_connection(err)``", a soft one
"send ``close_channel(err)``"; the error knows its channel. Nothing here imports trio.
"""

from __future__ import annotations

import logging
from typing import Final, NoReturn

import attrs

from ._events import (
    NEED_DATA,
    ContentReceived,
    EndOfStream,
    Event,
    MethodReceived,
    NeedData,
    ProtocolHeaderReceived,
)
from ._fastpath import FastPath
from ._framing import (
    FRAME_HEAD_SIZE,
    METHOD_IDS_SIZE,
    FrameReader,
    decode_method_frame,
    frame_error_text,
    is_connection_close,
    unpack_frame_head,
    wire_ids,
)
from ._state import (
    CHANNEL_RECEIVE_TRANSITIONS,
    CHANNEL_SEND_TRANSITIONS,
    MAX_BODY_SIZE,
    RABBIT_STATE_NAMES,
    RECEIVE_TRANSITIONS,
    SEND_TRANSITIONS,
    BodyBudget,
    Channel,
    ChannelState,
    State,
    content_owed,
)
from .errors import AMQPError, BadProtocolHeader, LocalProtocolError, ReplyCode
from .frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    PROTOCOL_HEADER,
    encode_method,
)
from .methods import (
    CHANNEL_CLASS_ID,
    CONNECTION_CLASS_ID,
    BasicPublish,
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ConnectionClose,
    ConnectionTuneOk,
    Method,
)

log = logging.getLogger(__name__)

# Looked up once (an enum member lookup costs more than a global's, on the hot path).
_AWAIT_HEADER: Final = State.AWAIT_HEADER
_OPEN: Final = State.OPEN
_CLOSING_STATES: Final = frozenset((State.CLOSING, State.CLOSED))  # we sent connection.close
_FRAME_TYPES: Final = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY))  # besides heartbeat
_CHANNEL_OPEN: Final = ChannelState.OPEN
_CHANNEL_CLOSING: Final = ChannelState.CLOSING
_CHANNEL_CLOSED: Final = ChannelState.CLOSED

# What a closing channel still reads (peeked by ids: the rest may be anything, even
# undecodable): close and close-ok, and channel.open, which is then a second open (504).
_CLOSING_CHANNEL_READS: Final = (
    wire_ids(ChannelClose),
    wire_ids(ChannelCloseOk),
    wire_ids(ChannelOpen),
)


@attrs.frozen
class Limits:
    """What the server offers in ``connection.tune`` and enforces."""

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 16 * 1024 * 1024
    # Bytes of message bodies begun and not finished, across the connection's channels.
    max_incomplete_body: int = 64 * 1024 * 1024
    # Largest frame accepted before tune-ok (RabbitMQ's initial_frame_max).
    initial_frame_max: int = 8192


class ServerConnection(FrameReader):
    """One client connection, seen from the server."""

    def __init__(self, limits: Limits = Limits(), shared_bodies: BodyBudget | None = None) -> None:
        super().__init__(limits.initial_frame_max)  # until tune-ok
        self.limits = limits
        # Incomplete message bodies: capped per connection, and across the connections that
        # share ``shared_bodies`` (the broker's).
        self.bodies = BodyBudget(limits.max_incomplete_body, "this connection", shared_bodies)
        self.state = State.AWAIT_HEADER
        # Negotiated in tune-ok; until then the pre-tune limits apply.
        self.channel_max = limits.channel_max
        self.frame_max = limits.frame_max
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self._fastpath = FastPath(
            self.channels, self._frame_limit, min(limits.max_message_size, MAX_BODY_SIZE)
        )

    # -- input -------------------------------------------------------------------------------

    def next_event(self) -> Event | NeedData:
        """The next complete event, ``NEED_DATA`` when more bytes are needed."""
        while True:
            if self._broken:
                return self._need_data()
            state = self.state
            if state is _AWAIT_HEADER:
                return self._read_protocol_header()
            buf, pos = self._buf, self._pos
            if len(buf) - pos < FRAME_HEAD_SIZE:
                return self._need_data()
            frame_type, channel, size = unpack_frame_head(buf, pos)
            if frame_type == FRAME_METHOD and state is _OPEN:
                fastpath = self._fastpath
                published = fastpath.publish(buf, pos, channel, size)
                if published is not None:
                    self._pos = fastpath.end
                    return published
            payload = self._take_frame(buf, pos, size)
            if payload is None:
                return self._need_data()
            event = self._handle_frame(frame_type, channel, payload)
            if event is not None:
                return event

    def _read_protocol_header(self) -> Event | NeedData:
        size = len(PROTOCOL_HEADER)
        got = self._buf[self._pos : self._pos + size]
        if got != PROTOCOL_HEADER[: len(got)]:
            self._broken = True
            raise BadProtocolHeader(f"bad protocol header {got!r}")
        if len(got) < size:
            return self._need_data()
        self._pos += size
        self.state = State.HEADER_RECEIVED
        return ProtocolHeaderReceived()

    def _handle_frame(self, frame_type: int, channel: int, payload: memoryview) -> Event | None:
        if self.state in _CLOSING_STATES and not is_connection_close(frame_type, channel, payload):
            return None  # after we sent connection.close only close and close-ok count
        if frame_type == FRAME_HEARTBEAT:
            if channel:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}")
            if payload:
                raise AMQPError(ReplyCode.FRAME_ERROR, "heartbeat frame with a payload")
            return None
        if frame_type not in _FRAME_TYPES:
            self._broken = True
            raise AMQPError(
                ReplyCode.FRAME_ERROR, frame_error_text(frame_type, payload, "unknown_frame")
            )
        if channel == 0:
            if frame_type != FRAME_METHOD:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, "content frame on channel 0")
            return self._connection_method(decode_method_frame(payload))
        if self.state is not _OPEN:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME,
                f"frame on channel {channel} before the connection is open",
            )
        ch = self.channels.get(channel)
        if frame_type == FRAME_METHOD:
            return self._channel_method(channel, ch, payload)
        if ch is None:
            raise AMQPError(ReplyCode.CHANNEL_ERROR, "expected 'channel.open'")
        if ch.state is _CHANNEL_CLOSING:
            return None
        if frame_type == FRAME_HEADER:
            return ch.content_header(channel, payload, self.limits.max_message_size)
        return ch.content_body(channel, payload)

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
                f"unexpected method in connection state {RABBIT_STATE_NAMES[self.state]}",
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
            _refuse_tune("frame_max", tune_ok.frame_max, "lower than the minimum", FRAME_MIN_SIZE)
        for name, value, limit in (
            ("channel_max", tune_ok.channel_max, ours.channel_max),
            ("frame_max", tune_ok.frame_max, ours.frame_max),
        ):
            if limit and not 0 < value <= limit:
                _refuse_tune(name, value, "higher than the maximum", limit)
        self.channel_max = tune_ok.channel_max or ours.channel_max or 0xFFFF  # 0: no limit
        self.frame_max = tune_ok.frame_max or ours.frame_max
        self.heartbeat = tune_ok.heartbeat
        self._frame_limit = self._fastpath.frame_limit = self.frame_max

    def _channel_method(
        self, channel: int, ch: Channel | None, payload: memoryview
    ) -> Event | None:
        # After we sent channel.close only close and close-ok count (and a second open).
        if (
            ch is not None
            and ch.state is _CHANNEL_CLOSING
            and payload[:METHOD_IDS_SIZE] not in _CLOSING_CHANNEL_READS
        ):
            return None
        method = decode_method_frame(payload)
        if isinstance(method, ChannelOpen):
            if channel > self.channel_max:
                raise AMQPError(
                    ReplyCode.NOT_ALLOWED,
                    f"number of channels opened ({channel}) has reached the negotiated "
                    f"channel_max ({self.channel_max})",
                    class_id=method.CLASS_ID,
                    method_id=method.METHOD_ID,
                )
            if ch is not None:
                raise AMQPError(
                    ReplyCode.CHANNEL_ERROR,
                    "second 'channel.open' seen",
                    class_id=method.CLASS_ID,
                    method_id=method.METHOD_ID,
                )
        elif ch is None:
            if isinstance(method, ChannelCloseOk):
                return None  # a late close-ok for a channel both sides already closed
            raise AMQPError(
                ReplyCode.CHANNEL_ERROR,
                "expected 'channel.open'",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        else:
            if method.CLASS_ID == CONNECTION_CLASS_ID:
                raise AMQPError(
                    ReplyCode.COMMAND_INVALID,
                    f"{method.NAME} on channel {channel}",
                    class_id=method.CLASS_ID,
                    method_id=method.METHOD_ID,
                )
            if ch.method is not None:
                raise content_owed(ch.method, ch.properties is not None, method.NAME)
            if method.HAS_CONTENT:
                if not isinstance(method, BasicPublish):
                    raise AMQPError(
                        ReplyCode.COMMAND_INVALID,
                        f"{method.NAME} is sent by servers only",
                        class_id=method.CLASS_ID,
                        method_id=method.METHOD_ID,
                    )
                ch.method = method
                return None
        if method.CLASS_ID == CHANNEL_CLASS_ID:
            state = _CHANNEL_CLOSED if ch is None else ch.state
            next_state = CHANNEL_RECEIVE_TRANSITIONS.get((state, type(method)), state)
            self._move_channel(channel, ch, next_state)
        return MethodReceived(channel, method)

    def _move_channel(self, channel: int, ch: Channel | None, state: ChannelState) -> None:
        """Put a channel in ``state``, adding or removing it from the table."""
        if state is _CHANNEL_CLOSED:
            if ch is not None:
                ch.reset_content()
                del self.channels[channel]
        elif ch is None:
            self.channels[channel] = Channel(self.bodies)
        else:
            ch.state = state

    # -- output ------------------------------------------------------------------------------

    def send_method(self, channel: int, method: Method) -> bytes:
        """Encode a method frame, applying what sending it does to the state; a method the
        state does not allow raises ``LocalProtocolError``."""
        class_id = method.CLASS_ID
        if channel == 0:
            next_state = SEND_TRANSITIONS.get((self.state, type(method)))
            if next_state is None:
                raise LocalProtocolError(
                    f"cannot send {method.NAME} in connection state {self.state.name.lower()}"
                )
            self.state = next_state
        elif class_id == CHANNEL_CLASS_ID:
            ch = self.channels.get(channel)
            state = _CHANNEL_CLOSED if ch is None else ch.state
            next_channel_state = CHANNEL_SEND_TRANSITIONS.get((state, type(method)))
            if next_channel_state is None:
                raise LocalProtocolError(
                    f"cannot send {method.NAME} on channel {channel} in state {state.name.lower()}"
                )
            if ch is not None and isinstance(method, ChannelClose):
                ch.reset_content()
            self._move_channel(channel, ch, next_channel_state)
        elif class_id == CONNECTION_CLASS_ID:
            raise LocalProtocolError(f"cannot send {method.NAME} on channel {channel}")
        return encode_method(channel, method)

    def release_bodies(self) -> None:
        """The connection is gone: give back what its incomplete bodies held of the budgets."""
        for ch in self.channels.values():
            ch.reset_content()

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
        return ch is not None and ch.state is _CHANNEL_OPEN


def _refuse_tune(name: str, value: int, relation: str, limit: int) -> NoReturn:
    raise AMQPError(
        ReplyCode.NOT_ALLOWED,
        f"negotiated {name} = {value} is {relation} allowed value ({limit})",
        class_id=ConnectionTuneOk.CLASS_ID,
        method_id=ConnectionTuneOk.METHOD_ID,
    )


__all__ = [
    "MAX_BODY_SIZE",
    "NEED_DATA",
    "BadProtocolHeader",
    "BodyBudget",
    "ContentReceived",
    "EndOfStream",
    "Event",
    "Limits",
    "LocalProtocolError",
    "MethodReceived",
    "NeedData",
    "ProtocolHeaderReceived",
    "ServerConnection",
    "State",
]
