"""Primitive AMQP 0-9-1 encodings: integers, strings, field tables and field arrays.

Responsibilities:
- read/write of shortstr, longstr and field tables with RabbitMQ's errata type letters
  (``t b B s u I i l f d D S A T F V x``);
- bounds: every length is checked against the bytes present before anything is allocated, nesting
  is capped at ``MAX_TABLE_DEPTH``; failures raise ``DecodeError`` (never ``IndexError``);
- ``add_long_header``: a header spliced into encoded basic properties, without decoding them.

Python representation of field values: ``bool``, ``int``, ``float``, ``decimal.Decimal``, ``str``
(``S``; invalid UTF-8 survives through ``surrogateescape``), ``bytes`` (``x``), ``datetime`` in UTC
(``T``, whole seconds, 1970 onwards; a naive datetime encodes as UTC), ``Timestamp`` (``T`` too: a
u64 of seconds past what a ``datetime`` holds, after year 9999, carried as RabbitMQ carries any
64-bit value), ``dict`` (``F``), ``list`` (``A``) and ``None`` (``V``). Integers encode as ``I``
when they fit 32 bits and ``l`` otherwise, as pika and RabbitMQ do.

Over 400 lines as one job: the field-table grammar (every type letter's reader and writer)
is one table, kept in one place so that reading and writing cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import struct
from collections.abc import Mapping, Sequence
from typing import TypeAlias, Union

from .errors import DecodeError

FieldValue: TypeAlias = Union[
    bool,
    int,
    float,
    decimal.Decimal,
    str,
    bytes,
    datetime.datetime,
    "Timestamp",
    "FieldTable",
    "FieldArray",
    None,
]
FieldTable: TypeAlias = dict[str, FieldValue]
FieldArray: TypeAlias = list[FieldValue]


class Long(int):
    """An int always encoded as a signed 64-bit ``l``, as RabbitMQ sends some headers (e.g.
    ``x-stream-offset``) whatever their value; plain ints take the smallest of ``I``/``l``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Timestamp:
    """A ``T`` field value that no ``datetime`` can hold (seconds since 1970 past 9999-12-31
    23:59:59, up to 2**64 - 1); encoded back as the same ``T``."""

    seconds: int

    def __post_init__(self) -> None:
        if not 0 <= self.seconds < 2**64:
            raise ValueError(f"timestamp out of the unsigned 64-bit range: {self.seconds}")


MAX_TABLE_DEPTH = 32

U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
F32 = struct.Struct(">f")
F64 = struct.Struct(">d")
_DECIMAL = struct.Struct(">Bi")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_LAST_DAY = datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)
_LAST_DATETIME = (_LAST_DAY - _EPOCH).days * 86400 + 86399  # 9999-12-31 23:59:59


def timestamp_value(seconds: int) -> datetime.datetime | Timestamp:
    """A ``T`` value of ``seconds`` since 1970: a UTC ``datetime`` if one can hold it, else a
    ``Timestamp`` (ValueError outside the unsigned 64-bit range)."""
    if 0 <= seconds <= _LAST_DATETIME:
        return _EPOCH + datetime.timedelta(seconds=seconds)
    return Timestamp(seconds)


def read_shortstr(buf: memoryview, off: int) -> tuple[str, int]:
    """Decode a shortstr (u8 length + UTF-8) at ``off``; return it and the next offset."""
    try:
        end = off + 1 + buf[off]
    except IndexError:
        raise DecodeError("shortstr length past end of data") from None
    if end > len(buf):
        raise DecodeError("shortstr longer than the data that holds it")
    try:
        return str(buf[off + 1 : end], "utf-8"), end
    except UnicodeDecodeError:
        raise DecodeError("Malformed UTF-8 in shortstr") from None


def read_longstr_bytes(buf: memoryview, off: int) -> tuple[bytes, int]:
    """Decode a longstr (u32 length + bytes) at ``off`` as raw bytes."""
    if off + 4 > len(buf):
        raise DecodeError("longstr length past end of data")
    end = off + 4 + U32.unpack_from(buf, off)[0]
    if end > len(buf):
        raise DecodeError("longstr longer than the data that holds it")
    return bytes(buf[off + 4 : end]), end


def read_longstr(buf: memoryview, off: int) -> tuple[str, int]:
    """Decode a longstr as text (invalid UTF-8 kept through ``surrogateescape``)."""
    raw, end = read_longstr_bytes(buf, off)
    return raw.decode("utf-8", "surrogateescape"), end


def read_table(buf: memoryview, off: int, depth: int = 0) -> tuple[FieldTable, int]:
    """Decode a field table (u32 byte length + name/value pairs) at ``off``."""
    if off + 4 > len(buf):
        raise DecodeError("table length past end of data")
    end = off + 4 + U32.unpack_from(buf, off)[0]
    if end > len(buf):
        raise DecodeError("table longer than the data that holds it")
    if depth >= MAX_TABLE_DEPTH:
        raise DecodeError(f"field tables nested deeper than {MAX_TABLE_DEPTH}")
    body = buf[:end]
    off += 4
    table: FieldTable = {}
    while off < end:
        key, off = read_shortstr(body, off)
        table[key], off = _read_value(body, off, depth + 1)
    return table, end


def _read_array(buf: memoryview, off: int, depth: int) -> tuple[FieldArray, int]:
    if off + 4 > len(buf):
        raise DecodeError("array length past end of data")
    end = off + 4 + U32.unpack_from(buf, off)[0]
    if end > len(buf):
        raise DecodeError("array longer than the data that holds it")
    if depth >= MAX_TABLE_DEPTH:
        raise DecodeError(f"field arrays nested deeper than {MAX_TABLE_DEPTH}")
    body = buf[:end]
    off += 4
    items: FieldArray = []
    while off < end:
        value, off = _read_value(body, off, depth + 1)
        items.append(value)
    return items, end


def _read_fixed(fmt: struct.Struct, buf: memoryview, off: int) -> tuple[int | float, int]:
    end = off + fmt.size
    if end > len(buf):
        raise DecodeError("field value past end of data")
    value: int | float = fmt.unpack_from(buf, off)[0]
    return value, end


def _read_value(buf: memoryview, off: int, depth: int) -> tuple[FieldValue, int]:
    if off >= len(buf):
        raise DecodeError("field value type past end of data")
    kind = buf[off]
    off += 1
    fixed = _FIXED_READERS.get(kind)
    if fixed is not None:
        return _read_fixed(fixed, buf, off)
    if kind == 0x74:  # t
        if off >= len(buf):
            raise DecodeError("boolean past end of data")
        return buf[off] != 0, off + 1
    if kind == 0x53:  # S
        return read_longstr(buf, off)
    if kind == 0x46:  # F
        return read_table(buf, off, depth)
    if kind == 0x41:  # A
        return _read_array(buf, off, depth)
    if kind == 0x54:  # T
        seconds, off = _read_fixed(U64, buf, off)
        return timestamp_value(int(seconds)), off
    if kind == 0x44:  # D
        if off + 5 > len(buf):
            raise DecodeError("decimal past end of data")
        scale, value = _DECIMAL.unpack_from(buf, off)
        return decimal.Decimal(value).scaleb(-scale), off + 5
    if kind == 0x78:  # x
        return read_longstr_bytes(buf, off)
    if kind == 0x56:  # V
        return None, off
    raise DecodeError(f"unknown field table type {chr(kind)!r}")


_FIXED_READERS: dict[int, struct.Struct] = {
    ord("b"): I8,
    ord("B"): U8,
    ord("s"): I16,
    ord("u"): U16,
    ord("I"): I32,
    ord("i"): U32,
    ord("l"): I64,
    ord("f"): F32,
    ord("d"): F64,
}


def write_shortstr(out: bytearray, value: str) -> None:
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {value[:40]!r}...")
    out.append(len(raw))
    out += raw


def write_longstr(out: bytearray, value: str | bytes) -> None:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    out += U32.pack(len(raw))
    out += raw


def write_table(out: bytearray, table: Mapping[str, FieldValue]) -> None:
    start = len(out)
    out += b"\0\0\0\0"
    for key, value in table.items():
        write_shortstr(out, key)
        _write_value(out, value)
    U32.pack_into(out, start, len(out) - start - 4)


# Basic content-header property flags before the headers table: content-type and
# content-encoding, two shortstrs; then the headers; bit 0 says another flags word follows.
_CONTENT_TYPE = 0x8000
_CONTENT_ENCODING = 0x4000
_HEADERS = 0x2000
_MORE_FLAGS = 0x0001
_LONG_VALUE = struct.Struct(">cq")
# Header names as shortstrs, for the few names ``add_long_header`` is called with.
_HEADER_KEYS: dict[str, bytes] = {}


def add_long_header(
    properties: bytes | bytearray | memoryview, name: str, value: int
) -> bytes | None:
    """Encoded basic properties (the flags word, then the properties present, in their order)
    with the header ``name`` = ``value`` (a signed 64-bit ``l``, as ``Long`` encodes) added
    at the end of the headers table, which is made if there is none. Every other byte stays
    as it was, so for properties in our encoding this is exactly ``encode()`` of the decoded
    properties with ``headers={**headers, name: Long(value)}``, without decoding or
    re-encoding anything. None when it cannot be spliced and the caller must decode: ``name``
    may already be in the table (its bytes occur in it: replacing is the decoder's job), a
    continued flags word, or bytes that do not hold the properties they announce."""
    if not isinstance(properties, bytes):
        properties = bytes(properties)
    size = len(properties)
    if size < 2:
        return None
    flags = properties[0] << 8 | properties[1]
    if flags & _MORE_FLAGS:
        return None
    pos = 2
    if flags & _CONTENT_TYPE:
        if pos >= size:
            return None
        pos += 1 + properties[pos]
    if flags & _CONTENT_ENCODING:
        if pos >= size:
            return None
        pos += 1 + properties[pos]
    key = _HEADER_KEYS.get(name)
    if key is None:
        raw = name.encode("utf-8", "surrogateescape")
        if len(raw) > 255:
            raise ValueError(f"shortstr longer than 255 bytes: {name[:40]!r}...")
        key = bytes((len(raw),)) + raw
        if len(_HEADER_KEYS) < 16:
            _HEADER_KEYS[name] = key
    entry = key + _LONG_VALUE.pack(b"l", value)
    if not flags & _HEADERS:
        if pos > size:
            return None
        return b"".join(
            (
                U16.pack(flags | _HEADERS),
                properties[2:pos],
                U32.pack(len(entry)),
                entry,
                properties[pos:],
            )
        )
    if pos + 4 > size:
        return None
    end = pos + 4 + U32.unpack_from(properties, pos)[0]
    if end > size or properties.find(key, pos + 4, end) >= 0:
        return None
    return b"".join(
        (
            properties[:pos],
            U32.pack(end - pos - 4 + len(entry)),
            properties[pos + 4 : end],
            entry,
            properties[end:],
        )
    )


_I64 = struct.Struct(">q")


class LongHeaderSplicer:
    """``add_long_header`` for a run of messages with equal properties (a stream's deliveries:
    most publishers send the same few blocks): the second time in a row the same block comes,
    the bytes around the value are kept, and each later splice is one join. Gives what
    ``add_long_header`` gives."""

    __slots__ = ("_last", "_name", "_template")

    def __init__(self) -> None:
        self._last: bytes | None = None
        self._name = ""
        self._template: tuple[bytes, bytes] | None = None

    def splice(self, properties: bytes, name: str, value: int) -> bytes | None:
        if (properties is self._last or properties == self._last) and name == self._name:
            template = self._template
            if template is None:
                template = self._template = _template(properties, name)
            if template is not None:
                return b"".join((template[0], _I64.pack(value), template[1]))
        else:
            self._last, self._name, self._template = properties, name, None
        return add_long_header(properties, name, value)


def _template(properties: bytes, name: str) -> tuple[bytes, bytes] | None:
    """The bytes before and after the 8-byte value ``add_long_header`` writes (None: it
    cannot splice)."""
    zero = add_long_header(properties, name, 0)
    ones = add_long_header(properties, name, -1)
    if zero is None or ones is None:
        return None
    at = next(i for i, (a, b) in enumerate(zip(zero, ones, strict=True)) if a != b)
    return zero[:at], zero[at + 8 :]


def encode_table(table: Mapping[str, FieldValue]) -> bytes:
    out = bytearray()
    write_table(out, table)
    return bytes(out)


def _write_array(out: bytearray, items: Sequence[FieldValue]) -> None:
    start = len(out)
    out += b"\0\0\0\0"
    for item in items:
        _write_value(out, item)
    U32.pack_into(out, start, len(out) - start - 4)


def _write_value(out: bytearray, value: FieldValue) -> None:
    if value is None:
        out += b"V"
    elif isinstance(value, bool):
        out += b"t\x01" if value else b"t\x00"
    elif isinstance(value, int):
        if -(2**31) <= value < 2**31 and not isinstance(value, Long):
            out += b"I" + I32.pack(value)
        elif -(2**63) <= value < 2**63:
            out += b"l" + I64.pack(value)
        else:
            raise ValueError(f"integer out of the signed 64-bit range: {value}")
    elif isinstance(value, float):
        out += b"d" + F64.pack(value)
    elif isinstance(value, str):
        out += b"S"
        write_longstr(out, value)
    elif isinstance(value, bytes | bytearray):
        out += b"x"
        write_longstr(out, bytes(value))
    elif isinstance(value, dict):
        out += b"F"
        write_table(out, value)
    elif isinstance(value, list | tuple):
        out += b"A"
        _write_array(out, value)
    elif isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)  # naive means UTC, as in pika and pamqp
        delta = value - _EPOCH
        seconds = delta.days * 86400 + delta.seconds  # whole seconds, exact
        if seconds < 0:
            raise ValueError(f"timestamp before 1970 cannot be encoded: {value}")
        out += b"T" + U64.pack(seconds)
    elif isinstance(value, Timestamp):
        out += b"T" + U64.pack(value.seconds)
    elif isinstance(value, decimal.Decimal):
        exponent = value.as_tuple().exponent
        if not isinstance(exponent, int):
            raise ValueError(f"cannot encode decimal {value}")
        scale = max(0, -exponent)
        unscaled = int(value.scaleb(scale))
        if scale > 255 or not -(2**31) <= unscaled < 2**31:
            raise ValueError(f"decimal out of AMQP range: {value}")
        out += b"D" + _DECIMAL.pack(scale, unscaled)
    else:
        raise ValueError(f"cannot encode {type(value).__name__} in a field table")
