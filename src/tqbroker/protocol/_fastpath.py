"""The publish fast path: a whole well-formed ``basic.publish`` parsed in one go.

Responsibilities:
- ``FastPath.publish``: a complete ``basic.publish`` + content header + body frame(s) at a
  position of the receive buffer, on an open channel that owes no content, becomes one
  ``ContentReceived``; anything else (incomplete, unusual or wrong) is None, and the
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

_PUBLISH_IDS: Final = wire_ids(BasicPublish)
# Where the properties start in a content header frame: frame head, class id, weight, body size.
_PROPERTIES_START: Final = CONTENT_HEAD.size
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
        """The publish whose method frame head (announcing ``size``) is at ``pos``; None when
        the frame-by-frame path must take it. On success ``end`` is where it ended."""
        ch = self._channels.get(channel)
        if ch is None or ch.state is not _OPEN or ch.method is not None:
            return None
        limit = self.frame_limit
        if limit and size > limit:
            return None
        head = FRAME_HEAD_SIZE  # a local: read several times
        start = pos + head
        end = start + size  # the method frame's end marker
        hpos = end + 1  # the content header frame
        n = len(buf)
        if (
            size < METHOD_IDS_SIZE
            or hpos + _PROPERTIES_START > n
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
            return None
        bpos = hend + 1
        if body_size == 0:
            body = b""
        else:
            parts: list[bytes] | None = None
            received = 0
            while True:
                if bpos + head > n:
                    return None
                kind, bchannel, bsize = unpack_frame_head(buf, bpos)
                bend = bpos + head + bsize
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
                    body = buf[bpos + head : bend]
                    bpos = bend + 1
                    break
                if received > body_size:
                    return None
                if parts is None:
                    parts = []
                parts.append(buf[bpos + head : bend])
                bpos = bend + 1
                if received == body_size:
                    body = b"".join(parts)
                    break
        self.end = bpos
        return ContentReceived(channel, method, buf[hpos + _PROPERTIES_START : hend], body)
