"""Field tables, field arrays and strings: round trips, RabbitMQ's errata type letters, bounds."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tqbroker.protocol import codec
from tqbroker.protocol.codec import (
    MAX_TABLE_DEPTH,
    Long,
    encode_table,
    read_longstr,
    read_longstr_bytes,
    read_shortstr,
    read_table,
    write_longstr,
    write_shortstr,
    write_table,
)
from tqbroker.protocol.errors import DecodeError

from .strategies import UTC, canonical, field_tables, field_values

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode(raw: bytes) -> dict[str, Any]:
    table, end = read_table(memoryview(raw), 0)
    assert end == len(raw)
    return table


def table_bytes(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def one_field(kind: bytes, payload: bytes, key: bytes = b"k") -> bytes:
    return table_bytes(bytes((len(key),)) + key + kind + payload)


# -- round trips ----------------------------------------------------------------------------------


@SETTINGS
@given(field_tables)
def test_table_round_trip(table: dict[str, Any]) -> None:
    assert canonical(decode(encode_table(table))) == canonical(table)


@SETTINGS
@given(st.lists(field_values, max_size=6))
def test_array_round_trip(items: list[Any]) -> None:
    raw = encode_table({"a": items})
    assert canonical(decode(raw)["a"]) == canonical(items)


@SETTINGS
@given(field_tables, st.binary(max_size=8), st.binary(max_size=8))
def test_table_decodes_at_an_offset_inside_a_larger_buffer(
    table: dict[str, Any], before: bytes, after: bytes
) -> None:
    raw = encode_table(table)
    decoded, end = read_table(memoryview(before + raw + after), len(before))
    assert end == len(before) + len(raw)
    assert canonical(decoded) == canonical(table)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (0, b"I"),
        (-(2**31), b"I"),
        (2**31 - 1, b"I"),
        (2**31, b"l"),
        (-(2**31) - 1, b"l"),
        (2**63 - 1, b"l"),
        (-(2**63), b"l"),
        (True, b"t"),
        (1.5, b"d"),
        ("s", b"S"),
        (b"x", b"x"),
        (bytearray(b"x"), b"x"),
        (None, b"V"),
        ([], b"A"),
        ((1, 2), b"A"),
        ({}, b"F"),
        (decimal.Decimal("1.5"), b"D"),
        (datetime.datetime(2020, 1, 1, tzinfo=UTC), b"T"),
    ],
)
def test_encoded_type_letters(value: Any, kind: bytes) -> None:
    raw = encode_table({"k": value})
    assert raw[6:7] == kind


def test_tuples_and_bytearrays_decode_as_lists_and_bytes() -> None:
    table = {"a": (1, "x"), "b": bytearray(b"\x00\xff")}  # not FieldValues: still encoded
    assert decode(encode_table(table)) == {  # type: ignore[arg-type]
        "a": [1, "x"],
        "b": b"\x00\xff",
    }


def test_exact_encoding_of_a_small_table() -> None:
    raw = encode_table({"a": 1, "b": "xy"})
    assert raw == table_bytes(b"\x01aI\x00\x00\x00\x01" + b"\x01bS\x00\x00\x00\x02xy")


@pytest.mark.parametrize(
    "value",
    [
        2**63,
        -(2**63) - 1,
        decimal.Decimal("NaN"),
        decimal.Decimal("Infinity"),
        decimal.Decimal("1E-256"),  # scale above 255
        decimal.Decimal(2**31),  # unscaled value beyond a signed 32-bit integer
        decimal.Decimal("1E+10"),
        object(),
        {1, 2},
        datetime.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
    ],
)
def test_unencodable_values_raise_value_error(value: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError will do
        encode_table({"k": value})


def test_naive_datetimes_encode_as_utc() -> None:
    naive = datetime.datetime(2021, 6, 1, 12, 30, 5)
    aware = naive.replace(tzinfo=UTC)
    assert encode_table({"t": naive}) == encode_table({"t": aware})
    assert decode(encode_table({"t": naive}))["t"] == aware


def test_aware_datetimes_in_other_zones_encode_as_the_same_instant() -> None:
    plus2 = datetime.timezone(datetime.timedelta(hours=2))
    local = datetime.datetime(2021, 6, 1, 14, 30, 5, tzinfo=plus2)
    decoded = decode(encode_table({"t": local}))["t"]
    assert decoded == local
    assert decoded.tzinfo == UTC


def test_datetime_fractions_of_a_second_are_dropped() -> None:
    moment = datetime.datetime(2021, 6, 1, 12, 30, 5, 999_999, tzinfo=UTC)
    assert decode(encode_table({"t": moment}))["t"] == moment.replace(microsecond=0)


def test_largest_datetime_round_trips() -> None:
    moment = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert decode(encode_table({"t": moment}))["t"] == moment


def test_key_longer_than_a_shortstr_is_rejected() -> None:
    write_table(bytearray(), {"k" * 255: 1})
    with pytest.raises(ValueError, match="shortstr"):
        write_table(bytearray(), {"k" * 256: 1})


# -- RabbitMQ errata type letters -----------------------------------------------------------------

ERRATA_CASES: list[tuple[bytes, bytes, Any]] = [
    (b"t", b"\x00", False),
    (b"t", b"\x01", True),
    (b"t", b"\x02", True),  # any non-zero octet is true
    (b"b", b"\xff", -1),
    (b"b", b"\x7f", 127),
    (b"B", b"\xff", 255),
    (b"s", b"\xff\xfe", -2),
    (b"u", b"\xff\xfe", 65534),
    (b"I", b"\xff\xff\xff\xfe", -2),
    (b"i", b"\xff\xff\xff\xfe", 2**32 - 2),
    (b"l", b"\xff" * 7 + b"\xfe", -2),
    (b"l", b"\x7f" + b"\xff" * 7, 2**63 - 1),
    (b"f", struct.pack(">f", 1.5), 1.5),
    (b"f", struct.pack(">f", -0.0), -0.0),
    (b"d", struct.pack(">d", -2.25), -2.25),
    (b"D", b"\x02" + struct.pack(">i", -12345), decimal.Decimal("-123.45")),
    (b"D", b"\x00" + struct.pack(">i", 7), decimal.Decimal(7)),
    (b"S", b"\x00\x00\x00\x05hello", "hello"),
    (b"S", b"\x00\x00\x00\x02\xc3\xa9", "\u00e9"),
    (b"S", b"\x00\x00\x00\x00", ""),
    (b"x", b"\x00\x00\x00\x03\x00\x01\xff", b"\x00\x01\xff"),
    (
        b"T",
        struct.pack(">Q", 1_700_000_000),
        datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
    ),
    (b"T", b"\x00" * 8, datetime.datetime(1970, 1, 1, tzinfo=UTC)),
    (b"V", b"", None),
    (b"A", struct.pack(">I", 7) + b"b\x05t\x01V" + b"B\x01", [5, True, None, 1]),
    (b"A", b"\x00\x00\x00\x00", []),
    (b"F", table_bytes(b"\x01nu\x00\x09"), {"n": 9}),
    (b"F", b"\x00\x00\x00\x00", {}),
]


@pytest.mark.parametrize(("kind", "payload", "expected"), ERRATA_CASES)
def test_errata_type_letters_decode(kind: bytes, payload: bytes, expected: Any) -> None:
    assert canonical(decode(one_field(kind, payload))["k"]) == canonical(expected)


def test_every_errata_letter_is_covered() -> None:
    assert {kind for kind, _, _ in ERRATA_CASES} == {bytes([c]) for c in b"bBsuIilfdDSATFVxt"}


def test_invalid_utf8_longstr_survives_through_surrogateescape() -> None:
    raw = one_field(b"S", b"\x00\x00\x00\x03a\xff\xfe")
    value = decode(raw)["k"]
    assert value == "a\udcff\udcfe"
    assert encode_table({"k": value}) == raw


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        (b"t", b""),
        (b"b", b""),
        (b"B", b""),
        (b"s", b"\x00"),
        (b"u", b"\x00"),
        (b"I", b"\x00\x00\x00"),
        (b"i", b"\x00\x00\x00"),
        (b"l", b"\x00" * 7),
        (b"f", b"\x00" * 3),
        (b"d", b"\x00" * 7),
        (b"D", b"\x00" * 4),
        (b"S", b"\x00\x00\x00"),
        (b"S", b"\x00\x00\x00\x05abcd"),
        (b"x", b"\x00\x00\x00\x02a"),
        (b"T", b"\x00" * 7),
        (b"A", b"\x00\x00\x00\x05I\x00"),
        (b"A", b"\x00\x00\x00\x02I\x00"),  # element overruns the array's own length
        (b"F", b"\x00\x00\x00\x09"),
        (b"F", b"\x00\x00\x00\x02\x05k"),  # key overruns the nested table
        (b"L", b"\x00" * 8),  # not a RabbitMQ type
        (b"U", b"\x00" * 2),
        (b"\x00", b""),
    ],
)
def test_malformed_values_raise_decode_error(kind: bytes, payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(one_field(kind, payload))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x00\x00",
        b"\x00\x00\x00\x01",  # length beyond the data
        table_bytes(b"\x05ab"),  # key longer than the table
        table_bytes(b"\x01k"),  # key without a value
        table_bytes(b"\x02\xff\xfeV"),  # key that is not UTF-8
        table_bytes(b"\x01kI\x00\x00\x00\x01\x01"),  # trailing half entry
    ],
)
def test_malformed_tables_raise_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        read_table(memoryview(raw), 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
@example(b"\x00\x00\x00\x03\x01kT")
@example(b"\x00\x00\x00\x0a\x01kT\xff\xff\xff\xff\xff\xff\xff")
def test_random_bytes_only_ever_raise_decode_error(raw: bytes) -> None:
    with contextlib.suppress(DecodeError):
        read_table(memoryview(raw), 0)


@settings(max_examples=300, deadline=None)
@given(field_tables, st.data())
def test_mutated_tables_only_ever_raise_decode_error(table: dict[str, Any], data: Any) -> None:
    raw = bytearray(encode_table(table))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(raw) - 1))
        raw[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    for candidate in (bytes(raw), bytes(raw[:cut])):
        with contextlib.suppress(DecodeError):
            read_table(memoryview(candidate), 0)


# -- nesting depth --------------------------------------------------------------------------------


def nested_tables(depth: int) -> bytes:
    """``depth`` tables, each holding the next under key ``k``."""
    raw = b"\x00\x00\x00\x00"
    for _ in range(depth - 1):
        raw = table_bytes(b"\x01kF" + raw)
    return raw


def nested_arrays(depth: int) -> bytes:
    """A table holding ``depth - 1`` arrays, each holding the next."""
    raw = b"\x00\x00\x00\x00"
    for _ in range(depth - 2):
        raw = struct.pack(">I", len(raw) + 1) + b"A" + raw
    return table_bytes(b"\x01kA" + raw)


def nested_mixed(depth: int) -> bytes:
    raw = b"\x00\x00\x00\x00"
    for level in range(depth - 1):
        if level % 2:
            raw = table_bytes(b"\x01kF" + raw)
        else:
            raw = struct.pack(">I", len(raw) + 1) + b"F" + raw  # an array holding one table
            raw = table_bytes(b"\x01kA" + raw)
    return raw


def test_nesting_up_to_the_limit_decodes() -> None:
    value: Any = decode(nested_tables(MAX_TABLE_DEPTH))
    for _ in range(MAX_TABLE_DEPTH - 1):
        value = value["k"]
    assert value == {}
    value = decode(nested_arrays(MAX_TABLE_DEPTH))["k"]
    for _ in range(MAX_TABLE_DEPTH - 2):
        value = value[0]
    assert value == []


@pytest.mark.parametrize("build", [nested_tables, nested_arrays, nested_mixed])
@pytest.mark.parametrize("depth", [MAX_TABLE_DEPTH + 1, 1000, 5000])
def test_deep_nesting_raises_decode_error_not_recursion_error(build: Any, depth: int) -> None:
    raw = build(depth)
    with pytest.raises(DecodeError, match="nested deeper"):
        read_table(memoryview(raw), 0)


# -- strings --------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=255).map(lambda s: s.encode()[:255].decode("utf-8", "ignore")))
def test_shortstr_round_trip(text: str) -> None:
    out = bytearray()
    write_shortstr(out, text)
    assert out[0] == len(text.encode())
    assert read_shortstr(memoryview(bytes(out)), 0) == (text, len(out))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=500))
def test_longstr_round_trip(text: str) -> None:
    out = bytearray()
    write_longstr(out, text)
    assert read_longstr(memoryview(bytes(out)), 0) == (text, len(out))
    assert read_longstr_bytes(memoryview(bytes(out)), 0) == (text.encode(), len(out))


def test_shortstr_boundaries() -> None:
    out = bytearray()
    write_shortstr(out, "\u00e9" * 127 + "x")  # exactly 255 bytes
    assert out[0] == 255
    with pytest.raises(ValueError, match="255"):
        write_shortstr(bytearray(), "\u00e9" * 128)  # 256 bytes in 128 characters


@pytest.mark.parametrize("raw", [b"", b"\x03ab", b"\x02\xff\xfe", b"\x01\x80"])
def test_bad_shortstrs_raise_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        read_shortstr(memoryview(raw), 0)


@pytest.mark.parametrize("raw", [b"", b"\x00\x00\x00", b"\x00\x00\x00\x03ab"])
def test_bad_longstrs_raise_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        read_longstr(memoryview(raw), 0)


def test_huge_declared_lengths_allocate_nothing() -> None:
    raw = b"\xff\xff\xff\xff" + b"x" * 10
    for reader in (read_longstr, read_longstr_bytes, read_table):
        with pytest.raises(DecodeError):
            reader(memoryview(raw), 0)


def test_module_docstring_lists_every_letter() -> None:
    assert codec.__doc__ is not None
    assert "t b B s u I i l f d D S A T F V x" in codec.__doc__


def test_long_is_always_a_64_bit_field() -> None:
    """RabbitMQ sends x-stream-offset as ``l`` whatever its value (Java clients cast to Long)."""
    entry = b"\x0fx-stream-offset" + b"l" + (5).to_bytes(8, "big")
    assert encode_table({"x-stream-offset": Long(5)}) == len(entry).to_bytes(4, "big") + entry
    assert decode(encode_table({"n": Long(5)})) == {"n": 5}
