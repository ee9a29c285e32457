"""AMQP 0-9-1 frames: constants and the encoders for everything the server sends.

Responsibilities:
- frame type constants, the protocol header, the frame layout ``type u8, channel u16, size u32,
  payload, 0xCE``;
- ``encode_method``: one method frame;
- the hot path: ``encode_delivery`` writes a whole ``basic.deliver`` / ``basic.get-ok`` /
  ``basic.return`` (method, content header, body frames) into one buffer with precompiled structs,
  reusing the content-header properties exactly as the publisher sent them;
  ``deliver_content`` / ``write_deliver_content``: a message's content-header and body-frame
  heads encoded once per channel number and reused for each of its deliveries there.

Decoding lives in ``connection.py`` (and ``_framing.py``, ``_fastpath.py``), which needs the
connection state to judge a frame.
"""

from __future__ import annotations

import struct

from .methods import BASIC_CLASS_ID, Method

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_MIN_SIZE = 4096
FRAME_OVERHEAD = 8  # type, channel, size, end marker

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_HEAD = struct.Struct(">BHI")
HEARTBEAT_FRAME = FRAME_HEAD.pack(FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTE

_METHOD_HEAD = struct.Struct(">BHIHH")  # frame head + class id + method id
CONTENT_HEAD = struct.Struct(">BHIHHQ")  # frame head + class id + weight + body size
_DELIVER_TAIL = struct.Struct(">QB")  # delivery tag + redelivered bit
# The end of the previous frame + the head of a content header frame (class id, weight, body
# size), and the end of the content header frame + the head of a body frame: packed together,
# one buffer append each.
_END_CONTENT_HEAD = struct.Struct(">BBHIHHQ")
_END_BODY_HEAD = struct.Struct(">BBHI")
# The bytes of a ``deliver_content`` that are not the names or the properties.
_DELIVER_CONTENT_OVERHEAD = _END_CONTENT_HEAD.size + _END_BODY_HEAD.size


def encode_method(channel: int, method: Method) -> bytes:
    """One method frame."""
    out = bytearray(_METHOD_HEAD.pack(FRAME_METHOD, channel, 0, method.CLASS_ID, method.METHOD_ID))
    method.encode_arguments(out)
    struct.pack_into(">I", out, 3, len(out) - 7)
    out += FRAME_END_BYTE
    return bytes(out)


def shortstr(value: str) -> bytes:
    """A shortstr with its length byte (callers of ``write_deliver`` encode names once)."""
    raw = value.encode()
    return bytes((len(raw),)) + raw


def write_content(
    out: bytearray, channel: int, properties: bytes, body: bytes | memoryview, frame_max: int
) -> None:
    """Append a content header frame and the body frames (each at most ``frame_max``; 0 means no
    limit: one body frame)."""
    size = len(body)
    out += CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), BASIC_CLASS_ID, 0, size)
    out += properties
    if size and (not frame_max or size <= frame_max - FRAME_OVERHEAD):  # one body frame
        out += _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size)
        out += body
        out += FRAME_END_BYTE
        return
    out += FRAME_END_BYTE
    chunk = frame_max - FRAME_OVERHEAD if frame_max else max(len(body), 1)
    for start in range(0, len(body), chunk):
        part = body[start : start + chunk]
        out += FRAME_HEAD.pack(FRAME_BODY, channel, len(part))
        out += part
        out += FRAME_END_BYTE


def write_deliver(
    out: bytearray,
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    names: bytes,
    properties: bytes,
    body: bytes | memoryview,
    frame_max: int,
) -> None:
    """Append a complete ``basic.deliver``. ``consumer_tag`` is a shortstr and ``names`` the
    exchange and routing key as two shortstrs (length bytes included), encoded by the caller once
    (``server.encoding.encoded_names``) rather than per delivery."""
    out += _METHOD_HEAD.pack(
        FRAME_METHOD, channel, 13 + len(consumer_tag) + len(names), BASIC_CLASS_ID, 60
    )
    out += consumer_tag
    out += _DELIVER_TAIL.pack(delivery_tag, redelivered)
    out += names
    size = len(body)
    if size and (not frame_max or size <= frame_max - FRAME_OVERHEAD):  # one body frame
        out += _END_CONTENT_HEAD.pack(
            FRAME_END, FRAME_HEADER, channel, 12 + len(properties), BASIC_CLASS_ID, 0, size
        )
        out += properties
        out += _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size)
        out += body
        out += FRAME_END_BYTE
        return
    out += FRAME_END_BYTE
    write_content(out, channel, properties, body, frame_max)


def deliver_content(channel: int, names: bytes, properties: bytes, body_size: int) -> bytes:
    """The part of a ``basic.deliver`` on ``channel`` from the exchange name up to the body, for
    a body that fits one frame (not empty, at most ``frame_max - FRAME_OVERHEAD``): ``names``
    (exchange and routing key, two shortstrs), the method frame's end, the content header
    frame, the body frame's head. It depends on neither the consumer nor the delivery tag, so
    a message delivered more than once on a channel number encodes it once
    (``server.encoding.write_deliver``); ``write_deliver_content`` appends it."""
    return b"".join(
        (
            names,
            _END_CONTENT_HEAD.pack(
                FRAME_END, FRAME_HEADER, channel, 12 + len(properties), BASIC_CLASS_ID, 0, body_size
            ),
            properties,
            _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, body_size),
        )
    )


def write_deliver_content(
    out: bytearray,
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    content: bytes,
    properties_size: int,
    body: bytes,
) -> None:
    """Append a complete ``basic.deliver`` of a body that fits one frame, from the
    ``deliver_content`` of its message for this ``channel`` (``properties_size``: the length
    of the properties in it). The same bytes as ``write_deliver``."""
    names_size = len(content) - properties_size - _DELIVER_CONTENT_OVERHEAD
    out += _METHOD_HEAD.pack(
        FRAME_METHOD, channel, 13 + len(consumer_tag) + names_size, BASIC_CLASS_ID, 60
    )
    out += consumer_tag
    out += _DELIVER_TAIL.pack(delivery_tag, redelivered)
    out += content
    out += body
    out += FRAME_END_BYTE


def write_get_ok(
    out: bytearray,
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> None:
    """Append a complete ``basic.get-ok``."""
    ex, rk = shortstr(exchange), shortstr(routing_key)
    size = 4 + 9 + len(ex) + len(rk) + 4
    out += _METHOD_HEAD.pack(FRAME_METHOD, channel, size, BASIC_CLASS_ID, 71)
    out += _DELIVER_TAIL.pack(delivery_tag, redelivered)
    out += ex
    out += rk
    out += struct.pack(">I", message_count)
    out += FRAME_END_BYTE
    write_content(out, channel, properties, body, frame_max)


def write_return(
    out: bytearray,
    channel: int,
    reply_code: int,
    reply_text: str,
    exchange: str,
    routing_key: str,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> None:
    """Append a complete ``basic.return``."""
    text, ex, rk = shortstr(reply_text), shortstr(exchange), shortstr(routing_key)
    size = 4 + 2 + len(text) + len(ex) + len(rk)
    out += _METHOD_HEAD.pack(FRAME_METHOD, channel, size, BASIC_CLASS_ID, 50)
    out += struct.pack(">H", reply_code)
    out += text
    out += ex
    out += rk
    out += FRAME_END_BYTE
    write_content(out, channel, properties, body, frame_max)
