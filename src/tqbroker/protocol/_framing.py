"""Frame splitting: bytes in, one frame at a time out, never more buffered than one frame needs.

Responsibilities:
- ``FrameReader``: the receive buffer (``receive_data``; ``b""`` is the end of the stream) and
  ``_take_frame``, which checks a frame's size against the frame limit from its head, before any
  payload is buffered, and its end marker; framing lost (a bad size or end marker) stops all
  reading;
- ``decode_method_frame``: a method frame payload decoded, or the AMQPError RabbitMQ answers;
- the layout sizes and the method ids as they appear on the wire, for peeking at frames.

``ServerConnection`` inherits the reader rather than holding one, so the hot path reads the buffer
from its own attributes.
"""

from __future__ import annotations

import logging
from typing import Final

from ._events import NEED_DATA, EndOfStream, NeedData
from .errors import AMQPError, DecodeError, ReplyCode, UnknownMethodError
from .frames import FRAME_END, FRAME_HEAD, FRAME_METHOD
from .methods import ConnectionClose, ConnectionCloseOk, Method, decode_method

log = logging.getLogger(__name__)

# The frame head: type, channel, payload size; its unpacker bound once (an attribute lookup
# fewer per frame).
FRAME_HEAD_SIZE: Final = FRAME_HEAD.size
unpack_frame_head: Final = FRAME_HEAD.unpack_from
# A method frame payload starts with the class and method ids.
METHOD_IDS_SIZE: Final = 4


def wire_ids(method: type[Method]) -> bytes:
    """A method's class and method ids as a method frame payload starts."""
    return method.INDEX.to_bytes(METHOD_IDS_SIZE, "big")


_CONNECTION_CLOSE_IDS: Final = (wire_ids(ConnectionClose), wire_ids(ConnectionCloseOk))


def is_connection_close(frame_type: int, channel: int, payload: memoryview) -> bool:
    """Whether a frame is ``connection.close``/``close-ok``, judged by the ids alone (the rest
    of a frame the connection discards may be anything, even undecodable)."""
    return (
        frame_type == FRAME_METHOD
        and channel == 0
        and payload[:METHOD_IDS_SIZE] in _CONNECTION_CLOSE_IDS
    )


def decode_method_frame(payload: memoryview) -> Method:
    """The method in a method frame payload: unknown ids are a 503, bad arguments a 501."""
    try:
        return decode_method(payload)
    except UnknownMethodError as exc:
        raise AMQPError(ReplyCode.COMMAND_INVALID, str(exc)) from None
    except DecodeError as exc:
        # Name the method that failed to decode, as RabbitMQ does, when the ids are there.
        class_id, method_id = (
            (payload[0] << 8 | payload[1], payload[2] << 8 | payload[3])
            if len(payload) >= METHOD_IDS_SIZE
            else (0, 0)
        )
        raise AMQPError(
            ReplyCode.FRAME_ERROR, str(exc), class_id=class_id, method_id=method_id
        ) from None


class FrameReader:
    """The receive buffer and the frame splitter over it."""

    def __init__(self, frame_limit: int) -> None:
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._broken = False  # framing lost: read nothing more
        # The largest frame payload accepted (0: no limit).
        self._frame_limit = frame_limit

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the socket; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._broken:
            return
        self._buf = self._buf[self._pos :] + data if self._pos else self._buf + data
        self._pos = 0

    def _need_data(self) -> EndOfStream | NeedData:
        """What ``next_event`` says when the buffer holds nothing complete."""
        return EndOfStream() if self._eof else NEED_DATA

    def _take_frame(self, buf: bytes, pos: int, size: int) -> memoryview | None:
        """The payload of the frame whose head (announcing ``size``) is at ``pos``, consumed;
        None while it is incomplete."""
        limit = self._frame_limit
        if limit and size > limit:
            self._broken = True
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                f"frame size {size} exceeds the negotiated frame_max {limit}",
            )
        end = pos + FRAME_HEAD_SIZE + size
        if len(buf) <= end:
            return None
        if buf[end] != FRAME_END:
            self._broken = True
            payload = buf[pos + FRAME_HEAD_SIZE : end]
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                frame_error_text(buf[pos], payload, f"{{invalid_frame_end_marker,{buf[end]}}}"),
            )
        self._pos = end + 1
        return memoryview(buf)[pos + FRAME_HEAD_SIZE : end]


def frame_error_text(frame_type: int, payload: bytes | memoryview, reason: str) -> str:
    """RabbitMQ's 501 text: ``type 1, all octets = <<0,10>>: {invalid_frame_end_marker,0}``
    (the octets cut short: the reply text is a shortstr)."""
    octets = ",".join(str(octet) for octet in bytes(payload[:80]))
    return f"type {frame_type}, all octets = <<{octets}>>: {reason}"
