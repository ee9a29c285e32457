"""``codec.add_long_header``: a header spliced into encoded basic properties (stream deliveries'
``x-stream-offset``) gives the bytes that decoding, adding the header and re-encoding gives."""

from __future__ import annotations

import struct

import attrs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tqbroker.model import Message, with_long_header
from tqbroker.protocol.codec import Long, LongHeaderSplicer, add_long_header, encode_table
from tqbroker.protocol.methods import BasicProperties

from .strategies import basic_properties, table_keys

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

longs = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**63 - 1, -1, -(2**63)]),
)
names = st.one_of(st.just("x-stream-offset"), table_keys)


def current_path(raw: bytes, name: str, value: int) -> bytes:
    """What stream deliveries did before splicing: decode, add the header, encode."""
    message = Message("ex", "rk", raw, b"body")
    headers = message.properties.headers or {}
    return message.with_headers({**headers, name: Long(value)}).properties_raw


def key_bytes(name: str) -> bytes:
    key = name.encode("utf-8", "surrogateescape")
    return bytes((len(key),)) + key


@SETTINGS
@given(basic_properties, names, longs)
@example(BasicProperties(), "x-stream-offset", 0)
@example(BasicProperties(headers={}), "x-stream-offset", 2**63 - 1)
@example(BasicProperties(content_type="", content_encoding="", headers={"a": 1}), "n", -1)
@example(BasicProperties(headers={"x-stream-offset": 5, "b": "c"}), "x-stream-offset", 7)
@example(BasicProperties(headers={"k": "..\x0fx-stream-offset.."}), "x-stream-offset", 7)
def test_splice_is_the_decode_and_encode_path(
    properties: BasicProperties, name: str, value: int
) -> None:
    raw = properties.encode()
    expected = current_path(raw, name, value)
    # The current path's output is what encode() gives for the evolved properties.
    headers = {**(properties.headers or {}), name: Long(value)}
    assert attrs.evolve(properties, headers=headers).encode() == expected

    spliced = add_long_header(raw, name, value)
    table = encode_table(properties.headers) if properties.headers is not None else b""
    if key_bytes(name) in table[4:]:  # may be there already: replacing is the decoder's job
        assert spliced is None
    else:
        assert spliced == expected
    # The model's function falls back to the decode path when the splice declines.
    assert with_long_header(raw, name, value) == expected


def test_existing_header_is_replaced_in_place() -> None:
    raw = BasicProperties(headers={"a": 1, "x-stream-offset": 3, "z": 2}).encode()
    assert add_long_header(raw, "x-stream-offset", 9) is None
    copy = Message("", "q", with_long_header(raw, "x-stream-offset", 9), b"")
    headers = copy.properties.headers
    assert headers == {"a": 1, "x-stream-offset": 9, "z": 2}
    assert headers is not None
    assert list(headers) == ["a", "x-stream-offset", "z"]


def test_publisher_encoding_of_other_headers_is_kept() -> None:
    """Splicing keeps the bytes the publisher sent (here a short ``s`` and a float ``f``, which
    a decode and re-encode would have turned into ``I`` and ``d``); a client decodes the same
    values, plus the offset at the end."""
    table = b"\x01as\x00\x07" + b"\x01bf" + struct.pack(">f", 1.5)
    raw = b"\xb0\x00" + b"\x03a/b" + struct.pack(">I", len(table)) + table + b"\x02"
    before = BasicProperties.decode(memoryview(raw))
    spliced = add_long_header(raw, "x-stream-offset", 42)
    assert spliced is not None
    entry = b"\x0fx-stream-offset" + b"l" + struct.pack(">q", 42)
    assert (
        spliced
        == (b"\xb0\x00" + b"\x03a/b" + struct.pack(">I", len(table) + len(entry)) + table + entry)
        + b"\x02"
    )
    after = BasicProperties.decode(memoryview(spliced))
    assert after == attrs.evolve(before, headers={"a": 7, "b": 1.5, "x-stream-offset": 42})


def test_no_headers_table_gets_one_after_the_two_shortstrs() -> None:
    raw = BasicProperties(content_type="t", content_encoding="e", delivery_mode=2).encode()
    spliced = add_long_header(raw, "x-stream-offset", 1)
    entry = b"\x0fx-stream-offset" + b"l" + struct.pack(">q", 1)
    assert spliced == (
        b"\xf0\x00" + b"\x01t" + b"\x01e" + struct.pack(">I", len(entry)) + entry + b"\x02"
    )


def test_what_cannot_be_spliced_is_left_to_the_decoder() -> None:
    name = "x-stream-offset"
    assert add_long_header(b"", name, 1) is None
    assert add_long_header(b"\x00", name, 1) is None
    assert add_long_header(b"\x00\x01", name, 1) is None  # a continued flags word
    assert add_long_header(b"\x80\x00", name, 1) is None  # content-type missing
    assert add_long_header(b"\x80\x00\x05ab", name, 1) is None  # content-type cut short
    assert add_long_header(b"\x20\x00\x00\x00", name, 1) is None  # table length cut short
    assert add_long_header(b"\x20\x00\x00\x00\x00\x09\x01a", name, 1) is None  # table cut short
    # A bytearray (or any buffer) is read as bytes.
    raw = BasicProperties(delivery_mode=1).encode()
    assert add_long_header(bytearray(raw), name, 5) == add_long_header(raw, name, 5)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=12),
    st.lists(basic_properties, min_size=3, max_size=3),
    st.lists(st.binary(max_size=30), min_size=3, max_size=3),
    names,
    st.lists(longs, min_size=12, max_size=12),
)
def test_the_splicer_gives_what_add_long_header_gives(
    order: list[int],
    properties: list[BasicProperties],
    garbage: list[bytes],
    name: str,
    values: list[int],
) -> None:
    """The same block object over and over (a stream's deliveries), other blocks between,
    blocks that cannot be spliced: always add_long_header's bytes."""
    blocks = [p.encode() for p in properties] + garbage
    splicer = LongHeaderSplicer()
    for i, value in zip(order * 2, values, strict=False):
        block = blocks[i if value % 2 else i + 3]
        assert splicer.splice(block, name, value) == add_long_header(block, name, value)
