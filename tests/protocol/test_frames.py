"""Frame encoders: the generic method frame and the fast delivery paths."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands as pamqp_commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from tqbroker.protocol import frames
from tqbroker.protocol.frames import (
    FRAME_HEAD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    encode_method,
    shortstr,
    write_content,
    write_deliver,
    write_get_ok,
    write_return,
)
from tqbroker.protocol.methods import BasicDeliver, BasicGetOk, BasicProperties, BasicReturn

from .strategies import basic_properties, shortstrs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

frame_maxes = st.one_of(st.integers(9, 200), st.sampled_from([4096, 131072]))
bodies = st.one_of(st.binary(max_size=600), st.just(b""))
channels = st.integers(1, 65535)
property_bytes = basic_properties.map(lambda p: p.encode())


def split_frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """Cut a byte string into (type, channel, payload), checking every frame end."""
    out = []
    pos = 0
    while pos < len(data):
        kind, channel, size = FRAME_HEAD.unpack_from(data, pos)
        end = pos + 7 + size
        assert data[end] == 0xCE
        out.append((kind, channel, data[pos + 7 : end]))
        pos = end + 1
    assert pos == len(data)
    return out


def generic_content(channel: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """What ``write_content`` must produce, spelled out the slow way."""
    head = struct.pack(">HHQ", 60, 0, len(body)) + properties
    out = struct.pack(">BHI", 2, channel, len(head)) + head + b"\xce"
    step = frame_max - 8
    for start in range(0, len(body), step):
        part = body[start : start + step]
        out += struct.pack(">BHI", 3, channel, len(part)) + part + b"\xce"
    return out


def pamqp_frames(data: bytes) -> list[tuple[int, Any]]:
    out = []
    while data:
        consumed, channel, value = pamqp_frame.unmarshal(data)
        out.append((channel, value))
        data = data[consumed:]
    return out


def test_constants() -> None:
    assert PROTOCOL_HEADER == b"AMQP\x00\x00\x09\x01"
    assert HEARTBEAT_FRAME == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    assert frames.FRAME_MIN_SIZE == 4096
    assert pamqp_header.ProtocolHeader().marshal() == PROTOCOL_HEADER
    _, channel, value = pamqp_frame.unmarshal(HEARTBEAT_FRAME)
    assert channel == 0
    assert value.name == "Heartbeat"


def test_shortstr_helper() -> None:
    assert shortstr("") == b"\x00"
    assert shortstr("\u00e9") == b"\x02\xc3\xa9"
    assert shortstr("x" * 255)[0] == 255


@SETTINGS
@given(channels, property_bytes, bodies, frame_maxes)
def test_write_content_splits_bodies_at_frame_max(
    channel: int, properties: bytes, body: bytes, frame_max: int
) -> None:
    out = bytearray(b"prefix")
    write_content(out, channel, properties, body, frame_max)
    assert out[:6] == b"prefix"
    assert bytes(out[6:]) == generic_content(channel, properties, body, frame_max)
    parts = split_frames(bytes(out[6:]))
    assert all(len(payload) + 8 <= frame_max for kind, _, payload in parts if kind == 3)
    assert b"".join(payload for kind, _, payload in parts if kind == 3) == body
    assert len(parts) == 1 + -(-len(body) // (frame_max - 8))


@SETTINGS
@given(
    channels,
    shortstrs,
    st.integers(0, 2**64 - 1),
    st.booleans(),
    shortstrs,
    shortstrs,
    property_bytes,
    bodies,
    frame_maxes,
)
def test_write_deliver_matches_the_generic_encoding(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> None:
    out = bytearray()
    write_deliver(
        out,
        channel,
        shortstr(consumer_tag),
        delivery_tag,
        redelivered,
        shortstr(exchange) + shortstr(routing_key),
        properties,
        body,
        frame_max,
    )
    method = BasicDeliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    expected = encode_method(channel, method) + generic_content(
        channel, properties, body, frame_max
    )
    assert bytes(out) == expected


@SETTINGS
@given(
    channels,
    st.integers(0, 2**64 - 1),
    st.booleans(),
    shortstrs,
    shortstrs,
    st.integers(0, 2**32 - 1),
    property_bytes,
    bodies,
    frame_maxes,
)
def test_write_get_ok_matches_the_generic_encoding(
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
    out = bytearray()
    write_get_ok(
        out,
        channel,
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
        message_count,
        properties,
        body,
        frame_max,
    )
    method = BasicGetOk(delivery_tag, redelivered, exchange, routing_key, message_count)
    expected = encode_method(channel, method) + generic_content(
        channel, properties, body, frame_max
    )
    assert bytes(out) == expected


@SETTINGS
@given(
    channels,
    st.integers(0, 65535),
    shortstrs,
    shortstrs,
    shortstrs,
    property_bytes,
    bodies,
    frame_maxes,
)
def test_write_return_matches_the_generic_encoding(
    channel: int,
    reply_code: int,
    reply_text: str,
    exchange: str,
    routing_key: str,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> None:
    out = bytearray()
    write_return(
        out, channel, reply_code, reply_text, exchange, routing_key, properties, body, frame_max
    )
    method = BasicReturn(reply_code, reply_text, exchange, routing_key)
    expected = encode_method(channel, method) + generic_content(
        channel, properties, body, frame_max
    )
    assert bytes(out) == expected


def test_write_deliver_appends_several_deliveries() -> None:
    out = bytearray()
    props = BasicProperties(content_type="text/plain", delivery_mode=2).encode()
    for tag in (1, 2):
        write_deliver(out, 5, shortstr("c"), tag, False, shortstr("e") + shortstr("r"), props,
                      b"x" * 10, 4096)  # fmt: skip
    kinds = [(kind, channel) for kind, channel, _ in split_frames(bytes(out))]
    assert kinds == [(1, 5), (2, 5), (3, 5)] * 2


# -- pamqp reads what the fast paths write --------------------------------------------------------

names = st.text(alphabet="abcXYZ019-_.:", max_size=30)


@settings(max_examples=100, deadline=None)
@given(
    channels,
    names,
    st.integers(0, 2**63 - 1),
    st.booleans(),
    names,
    names,
    st.binary(max_size=300),
    st.integers(9, 100),
)
def test_pamqp_reads_write_deliver(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int,
) -> None:
    props = BasicProperties(content_type="application/json", headers={"n": 1}, priority=3)
    out = bytearray()
    write_deliver(
        out,
        channel,
        shortstr(consumer_tag),
        delivery_tag,
        redelivered,
        shortstr(exchange) + shortstr(routing_key),
        props.encode(),
        body,
        frame_max,
    )
    parsed = pamqp_frames(bytes(out))
    assert all(ch == channel for ch, _ in parsed)
    deliver, content_header = parsed[0][1], parsed[1][1]
    assert isinstance(deliver, pamqp_commands.Basic.Deliver)
    assert (
        deliver.consumer_tag,
        deliver.delivery_tag,
        deliver.redelivered,
        deliver.exchange,
        deliver.routing_key,
    ) == (consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    assert isinstance(content_header, pamqp_header.ContentHeader)
    assert content_header.body_size == len(body)
    assert content_header.properties.content_type == "application/json"
    assert content_header.properties.headers == {"n": 1}
    assert content_header.properties.priority == 3
    assert all(isinstance(value, pamqp_body.ContentBody) for _, value in parsed[2:])
    assert b"".join(value.value for _, value in parsed[2:]) == body


def test_pamqp_reads_write_get_ok_and_write_return() -> None:
    out = bytearray()
    write_get_ok(out, 2, 42, True, "amq.direct", "k", 7, b"\x00\x00", b"hello", 4096)
    write_return(out, 2, 312, "NO_ROUTE", "amq.direct", "k", b"\x00\x00", b"", 4096)
    parsed = pamqp_frames(bytes(out))
    get_ok = parsed[0][1]
    assert isinstance(get_ok, pamqp_commands.Basic.GetOk)
    assert (get_ok.delivery_tag, get_ok.redelivered, get_ok.exchange) == (42, True, "amq.direct")
    assert (get_ok.routing_key, get_ok.message_count) == ("k", 7)
    assert parsed[1][1].body_size == 5
    assert parsed[2][1].value == b"hello"
    returned = parsed[3][1]
    assert isinstance(returned, pamqp_commands.Basic.Return)
    assert (returned.reply_code, returned.reply_text) == (312, "NO_ROUTE")
    assert parsed[4][1].body_size == 0
    assert len(parsed) == 5  # an empty body has no body frame


@pytest.mark.parametrize("body", [b"", b"x", b"y" * 200_000])
def test_frame_max_zero_means_one_body_frame(body: bytes) -> None:
    out = bytearray()
    write_content(out, 1, b"\x00\x00", body, 0)
    parts = split_frames(bytes(out))
    assert [p for k, _, p in parts if k == 3] == ([body] if body else [])


@pytest.mark.parametrize("frame_max", [4096, 131072])
def test_body_exactly_filling_frames(frame_max: int) -> None:
    body = b"z" * ((frame_max - 8) * 3)
    out = bytearray()
    write_content(out, 1, b"\x00\x00", body, frame_max)
    parts = split_frames(bytes(out))
    assert [len(p) for k, _, p in parts if k == 3] == [frame_max - 8] * 3
