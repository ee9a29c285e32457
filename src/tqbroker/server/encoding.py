"""A message's ``basic.deliver`` frames, encoded for the wire as cheaply as repeated delivery
allows (the hot path of consuming).

Responsibilities:
- ``encoded_names``: the exchange and routing key as two shortstrs, encoded once per message
  however many queues and consumers it reaches;
- ``write_deliver``: append a ``basic.deliver`` with its content; from a message's second
  delivery on a channel number (fanout, requeue), reuse its content frames' heads encoded there
  once (``frames.deliver_content``);
- ``write_delivers``: a batch of deliveries to one consumer, the reused case inlined;
- ``write_encoded_delivers``: a batch of deliveries given as their encoded parts (a stream's
  records as they lie in its log: no ``Message``), each appended with one pack.

What is kept lives in ``Message.delivery_cache``, a slot the model leaves to this module: None
until first delivered, then the names (bytes), then from a second delivery the channel number
and the content encoded for it (``tuple[int, bytes]``). A message spliced for a stream delivery
"""

from __future__ import annotations

import logging
import struct

from ..backends.base import Popped
from ..broker.consumer import EncodedDelivery
from ..model import Message
from ..protocol import frames
from ..protocol.errors import ReplyCode
from ..protocol.frames import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    deliver_content,
    write_deliver_content,
)
from ..protocol.frames import write_deliver as _write_deliver
from ..protocol.methods import BASIC_CLASS_ID

# ``basic.deliver``'s method frame head (type, channel, size, class, method).
_METHOD_HEAD = struct.Struct(">BHIHH")
# What ``frames.deliver_content`` puts around the names: the end of the method frame, the
# content header frame's head and fixed fields, the body frame's head.
_CONTENT_OVERHEAD = 1 + 7 + 12 + 1 + 7

log = logging.getLogger(__name__)


def encoded_names(message: Message) -> bytes:
    """Exchange and routing key as two shortstrs, as ``basic.deliver`` carries them (kept in
    ``message.delivery_cache`` from the first call on)."""
    cached = message.delivery_cache
    if isinstance(cached, bytes):
        return cached
    exchange, routing_key = message.exchange.encode(), message.routing_key.encode()
    names = bytes((len(exchange),)) + exchange + bytes((len(routing_key),)) + routing_key
    if cached is None:
        message.delivery_cache = names
    return names


def write_deliver(
    out: bytearray,
    message: Message,
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    frame_max: int,
) -> None:
    """Append a ``basic.deliver`` of ``message`` (``frames.write_deliver``; ``consumer_tag`` as
    a shortstr). The first delivery encodes it in full and keeps the names (``encoded_names``);
    a further one on a channel number encodes the content frames' heads there once
    (``frames.deliver_content``) and reuses them for the next deliveries on that number. Only
    the latest channel number's are kept: a message delivered once (most) keeps only its
    names."""
    body = message.body
    size = len(body)
    cached = message.delivery_cache
    one_frame = size and (not frame_max or size <= frame_max - FRAME_OVERHEAD)
    if one_frame and isinstance(cached, tuple) and cached[0] == channel:
        content: bytes = cached[1]
    else:
        # Kept from the first delivery on (``encoded_names``, inlined when kept).
        names = cached if isinstance(cached, bytes) else encoded_names(message)
        if cached is None or not one_frame:  # the first delivery, or several body frames
            _write_deliver(
                out,
                channel,
                consumer_tag,
                delivery_tag,
                redelivered,
                names,
                message.properties_raw,
                body,
                frame_max,
            )
            return
        content = deliver_content(channel, names, message.properties_raw, size)
        message.delivery_cache = (channel, content)
    write_deliver_content(
        out,
        channel,
        consumer_tag,
        delivery_tag,
        redelivered,
        content,
        len(message.properties_raw),
        body,
    )


def write_delivers(
    out: bytearray,
    channel: int,
    consumer_tag: bytes,
    first_tag: int,
    entries: list[Popped],
    frame_max: int,
) -> int:
    """``write_deliver`` each of ``entries`` (``message_id, message, redelivered``) with the
    delivery tags from ``first_tag`` on; the number of them redelivered. A message whose
    content is already encoded for this channel number (``write_deliver``) is appended here
    with one pack for its method frame's head (``basic.deliver`` is ``>BHIHH``, the consumer
    tag, ``>QB``) and its content and body as they are."""
    tag_size = len(consumer_tag)
    heads: dict[int, struct.Struct] = {}  # by the size of the names
    redelivered_count = 0
    limit = frame_max - FRAME_OVERHEAD if frame_max else 0
    tag = first_tag
    for _message_id, message, redelivered in entries:
        if redelivered:
            redelivered_count += 1
        cached = message.delivery_cache
        body = message.body
        if (
            type(cached) is tuple
            and cached[0] == channel
            and body
            and (not limit or len(body) <= limit)
        ):
            content: bytes = cached[1]
            names_size = len(content) - len(message.properties_raw) - _CONTENT_OVERHEAD
            head = heads.get(names_size)
            if head is None:
                head = heads[names_size] = struct.Struct(f">BHIHH{tag_size}sQB")
            out += head.pack(
                FRAME_METHOD,
                channel,
                13 + tag_size + names_size,
                BASIC_CLASS_ID,
                60,
                consumer_tag,
                tag,
                redelivered,
            )
            out += content
            out += body
            out += b"\xce"
        else:
            write_deliver(out, message, channel, consumer_tag, tag, redelivered, frame_max)
        tag += 1
    return redelivered_count


def write_encoded_delivers(
    out: bytearray,
    channel: int,
    consumer_tag: bytes,
    first_tag: int,
    entries: list[EncodedDelivery],
    frame_max: int,
) -> None:
    """Append a ``basic.deliver`` for each of ``entries`` (``message_id, names, properties,
    body``), the delivery tags from ``first_tag`` on, none redelivered: the same bytes as
    ``write_deliver``. A body that fits one frame goes with one pack for everything before it
    (the method frame, the content header frame, the body frame's head; a ``struct`` per size
    of the names and the properties)."""
    heads: dict[tuple[int, int], struct.Struct] = {}
    limit = frame_max - FRAME_OVERHEAD if frame_max else 0
    tag_size = len(consumer_tag)
    tag = first_tag
    for _message_id, names, properties, body in entries:
        size = len(body)
        if size and (not limit or size <= limit):
            shape = (len(names), len(properties))
            head = heads.get(shape)
            if head is None:
                head = heads[shape] = struct.Struct(
                    f">BHIHH{tag_size}sQB{shape[0]}sBBHIHHQ{shape[1]}sBBHI"
                )
            out += head.pack(
                FRAME_METHOD,
                channel,
                13 + tag_size + shape[0],
                BASIC_CLASS_ID,
                60,
                consumer_tag,
                tag,
                False,
                names,
                FRAME_END,
                FRAME_HEADER,
                channel,
                12 + shape[1],
                BASIC_CLASS_ID,
                0,
                size,
                properties,
                FRAME_END,
                FRAME_BODY,
                channel,
                size,
            )
            out += body
            out += b"\xce"
        else:
            _write_deliver(
                out, channel, consumer_tag, tag, False, names, properties, body, frame_max
            )
        tag += 1


def write_get_ok(
    out: bytearray,
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    message: Message,
    left: int,
    frame_max: int,
) -> None:
    """Append ``basic.get-ok`` with the message (``left``: messages still ready)."""
    frames.write_get_ok(
        out,
        channel,
        delivery_tag,
        redelivered,
        message.exchange,
        message.routing_key,
        left,
        message.properties_raw,
        message.body,
        frame_max,
    )


def write_return(out: bytearray, channel: int, message: Message, frame_max: int) -> None:
    """Append ``basic.return`` 312 NO_ROUTE with the unroutable mandatory message."""
    frames.write_return(
        out,
        channel,
        ReplyCode.NO_ROUTE,
        "NO_ROUTE",
        message.exchange,
        message.routing_key,
        message.properties_raw,
        message.body,
        frame_max,
    )
