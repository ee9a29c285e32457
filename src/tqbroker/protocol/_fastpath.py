"""The publish fast path: a whole well-formed ``basic.publish`` parsed in one go.

Responsibilities:
- ``FastPath.publish``: a complete ``basic.publish`` + content header + body frame(s) at a
  position of the receive buffer, on an open channel that owes no content, becomes one
  ``ContentReceived``, together with the complete publishes right after it that repeat its
  method frame byte for byte (a run: one event, one permission check and one route for all,
  up to ``RUN_MAX``); anything else (incomplete, unusual or wrong) is None, and the
  frame-by-frame path takes it from the method frame on, so every error is raised there exactly
  as without this;
- the connection's publish cache: ``basic.publish`` arguments as sent -> the decoded method
  (frozen, so shared), so that a publisher repeating its exchange and routing key costs a dict
  lookup, not a decode and an object. Bounded: emptied when full. One per connection, so
  connections (and brokers in threads) share nothing.
"""

from __future__ import annotations

import logging
from typing import Final

from ._events import ContentReceived
from ._framing import FRAME_HEAD_SIZE, METHOD_IDS_SIZE, unpack_frame_head, wire_ids
from ._state import CONTENT_HEADER_MIN, Channel, ChannelState
from .errors import DecodeError
from .frames import CONTENT_HEAD, FRAME_BODY, FRAME_END, FRAME_HEADER
from .methods import BASIC_CLASS_ID, BasicPublish, decode_method

log = logging.getLogger(__name__)

PUBLISHES_MAX: Final = 1024
# The most publishes one event carries: the connection cannot give way within one.
RUN_MAX: Final = 256

_PUBLISH_IDS: Final = wire_ids(BasicPublish)
# Where the properties start in a content header frame: frame head, class id, weight, body size.
_PROPERTIES_START: Final = CONTENT_HEAD.size
_CONTENT_FIXED: Final = _PROPERTIES_START - FRAME_HEAD_SIZE  # class id, weight, body size
_OPEN: Final = ChannelState.OPEN
# Bound once: an attribute lookup fewer per publish.
_unpack_content_head: Final = CONTENT_HEAD.unpack_from


class FastPath:
    """One connection's publish fast path and its cache. ``frame_limit`` follows the
    connection's (0: no limit); ``end`` is where the last publish taken ended."""

    __slots__ = ("_body_max", "_channels", "_publishes", "end", "frame_limit")

    def __init__(self, channels: dict[int, Channel], frame_limit: int, body_max: int) -> None:
        self._channels = channels  # the connection's, shared
        self.frame_limit = frame_limit
        # The largest body taken (a larger one is an error, raised by the frame-by-frame path).
        self._body_max = body_max
        self._publishes: dict[bytes, BasicPublish] = {}
        self.end = 0

    def publish(self, buf: bytes, pos: int, channel: int, size: int) -> ContentReceived | None:
        """The publish whose method frame head (announcing ``size``) is at ``pos``, and those
        after it that repeat its method frame; None when the frame-by-frame path must take it.
        On success ``end`` is where the last one ended."""
        ch = self._channels.get(channel)
        if ch is None or ch.state is not _OPEN or ch.method is not None:
            return None
        limit = self.frame_limit
        if limit and size > limit:
            return None
        start = pos + FRAME_HEAD_SIZE
        end = start + size  # the method frame's end marker
        if (
            size < METHOD_IDS_SIZE
            or end + 1 + _PROPERTIES_START > len(buf)
            or not buf.startswith(_PUBLISH_IDS, start)
            or buf[end] != FRAME_END
        ):
            return None
        args = buf[start + METHOD_IDS_SIZE : end]
        publishes = self._publishes
        method = publishes.get(args)
        if method is None:
            try:
                decoded = decode_method(memoryview(buf)[start:end])
            except DecodeError:
                return None
            assert isinstance(decoded, BasicPublish)
            method = decoded
            if len(publishes) >= PUBLISHES_MAX:
                publishes.clear()
            publishes[args] = method
        properties: list[bytes] = []
        bodies: list[bytes] = []
        after = self._content(buf, end + 1, channel, properties, bodies)
        if after < 0:
            return None
        frame = buf[pos : end + 1]  # a run's publishes repeat it
        frame_size = len(frame)
        # Most runs repeat their content header and body frame head too (the same properties
        # and body size, one body frame): then what comes before a body is this prefix, byte
        # for byte, checked by the first publish, and a body needs only its end marker checked.
        props, body = properties[0], bodies[0]
        body_size = len(body)
        header_end = end + 1 + FRAME_HEAD_SIZE + _CONTENT_FIXED + len(props) + 1
        one_frame = after == (
            header_end + FRAME_HEAD_SIZE + body_size + 1 if body_size else header_end
        )
        prefix = buf[pos : after - body_size - 1] if body_size else buf[pos:after]
        prefix_size = len(prefix)
        n = len(buf)
        while len(bodies) < RUN_MAX:
            if one_frame and buf.startswith(prefix, after):
                start = after + prefix_size
                if body_size:
                    stop = start + body_size
                    if stop >= n or buf[stop] != FRAME_END:
                        break  # the frame-by-frame path says what is wrong
                    bodies.append(buf[start:stop])
                    after = stop + 1
                else:
                    bodies.append(b"")
                    after = start
                properties.append(props)
                continue
            if not buf.startswith(frame, after):
                break
            taken = self._content(buf, after + frame_size, channel, properties, bodies)
            if taken < 0:
                break
            after = taken
        self.end = after
        return ContentReceived(channel, method, properties, bodies)

    def _content(
        self, buf: bytes, hpos: int, channel: int, properties: list[bytes], bodies: list[bytes]
    ) -> int:
        """Take the content header frame at ``hpos`` and the body frames after it: append
        the properties and the body, and return where they end; -1 (nothing taken) when the
        frame-by-frame path must take them."""
        n = len(buf)
        if hpos + _PROPERTIES_START > n:
            return -1
        head = FRAME_HEAD_SIZE  # a local: read several times
        limit = self.frame_limit
        kind, hchannel, hsize, class_id, weight, body_size = _unpack_content_head(buf, hpos)
        hend = hpos + head + hsize
        if (
            kind != FRAME_HEADER
            or hchannel != channel
            or hsize < CONTENT_HEADER_MIN
            or (limit and hsize > limit)
            or hend >= n
            or buf[hend] != FRAME_END
            or class_id != BASIC_CLASS_ID
            or weight != 0
            or body_size > self._body_max
        ):
            return -1
        bpos: int = hend + 1
        if body_size == 0:
            body = b""
        else:
            parts: list[bytes] | None = None
            received = 0
            while True:
                if bpos + head > n:
                    return -1
                kind, bchannel, bsize = unpack_frame_head(buf, bpos)
                bend = bpos + head + bsize
                if (
                    kind != FRAME_BODY
                    or bchannel != channel
                    or (limit and bsize > limit)
                    or bend >= n
                    or buf[bend] != FRAME_END
                ):
                    return -1
                received += bsize
                if received == body_size and parts is None:
                    body = buf[bpos + head : bend]
                    bpos = bend + 1
                    break
                if received > body_size:
                    return -1
                if parts is None:
                    parts = []
                parts.append(buf[bpos + head : bend])
                bpos = bend + 1
                if received == body_size:
                    body = b"".join(parts)
                    break
        properties.append(buf[hpos + _PROPERTIES_START : hend])
        bodies.append(body)
        return bpos
