"""Fetched bulk bodies into Arrow: a ``TQR1`` (columns) or ``TQF1`` (frames) fetch becomes a
``pyarrow.RecordBatch`` in Spark's Kafka schema without a loop per field (the columns are
wrapped with ``Array.from_buffers``). The sink's side is ``_arrow_write.py``.

Responsibilities:
- ``read_schema`` / ``READ_DDL``: the source's schema, equal to what Spark expects for it
  (``to_arrow_schema(schema, timezone="UTC")``): ``partition`` int32, ``timestamp``
  ``timestamp[us, tz=UTC]``, headers as ``list<element: struct<key, value>>``;
- ``decode_fetch``: a ``TQR1`` body (columns) or a ``TQF1`` body (the log's frames as they lie
  on disk, ``docs/storage-format.md``) as a ``Fetched`` (the batch, the offsets it holds, where
  to go on); an empty routing key becomes a null ``key`` (Kafka's keyless record). Frames are
  walked with one Python step per record (finding where each starts); their fields are then
  gathered by NumPy and their keys and values cut out by Arrow (``take``), no loop per record.

Header values: the broker's headers are AMQP field tables, Kafka's are bytes. A string becomes
its UTF-8 bytes, a byte array (``{"bytes": <base64>}`` in the broker's JSON) its bytes, null
stays null and anything else (numbers, booleans, lists, tables) its JSON text.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..protocol.kafka import compression
from ..protocol.kafka.records import decode_batch
from ..recordbatch import FRAMES_MAGIC, READ_MAGIC

# Kafka's timestampType: 0 CreateTime, 1 LogAppendTime. The broker stamps a message when it
# receives it, so every record's timestamp is a log-append time.
LOG_APPEND_TIME = 1

_READ_HEAD = struct.Struct("<4sIq")  # TQR1 and TQF1 alike
# In a TQF1 body's frames: a frame's start (length, crc, offset, timestamp_ms, flags) and an
# entry's length. A record is read as if it were a batch entry starting 8 bytes into its frame:
# its names, timestamp and the low half of its offset then lie where an entry has its names,
# timestamp and offset delta (the high half goes into the base its delta is added to).
_FRAME_START = struct.Struct(">IIQQB")
_U32_BE = struct.Struct(">I")
_FLAG_BATCH = 0x80
_FLAG_KAFKA = 0x40  # with _FLAG_BATCH: a Kafka producer's batch as produced (format 3)
_FLAG_COMPRESSED = 0x20  # with _FLAG_BATCH: a format 2 batch whose entries are compressed
_FRAME_HEAD, _FRAME_FIXED = struct.Struct(">II"), struct.Struct(">QQB")  # _FRAME_START's parts
_ENTRY_HEAD = struct.Struct(">IIQB")  # a batch entry's length, offset delta, timestamp, flags
_ENTRY_DELTA_AT, _ENTRY_TIMESTAMP_AT, _ENTRY_NAMES_AT = 4, 8, 17
_MAX_OFFSET = 2**63 - 1
_MAX_MS = (2**63 - 1) // 1000  # Spark's timestamps are microseconds in an int64
_MAX_FRAMES_BODY = 2**31 - 1
_BYTES_4 = np.arange(4)
_BYTES_8 = np.arange(8)

_BASE_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"

_HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_HEADERS_TYPE = pa.list_(pa.field("element", _HEADER_STRUCT))


def read_ddl(include_headers: bool) -> str:
    return f"{_BASE_DDL}, {HEADERS_DDL}" if include_headers else _BASE_DDL


def read_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS_TYPE))
    return pa.schema(fields)


@dataclass
class Fetched:
    batch: pa.RecordBatch
    offsets: np.ndarray[Any, np.dtype[np.int64]]  # the records' offsets, ascending
    next_offset: int  # where to continue reading

    def __len__(self) -> int:
        return len(self.offsets)


def fetch_head(body: bytes) -> tuple[int, int] | None:
    """A ``TQR1`` or ``TQF1`` body's record (or frame) count and next offset; None if it is
    neither."""
    if len(body) < _READ_HEAD.size:
        return None
    magic, count, next_offset = _READ_HEAD.unpack_from(body)
    return (count, next_offset) if magic in (READ_MAGIC, FRAMES_MAGIC) else None


def decode_fetch(
    body: bytes,
    topic: str,
    partition: int,
    *,
    include_headers: bool,
    start: int = 0,
    end: int = 2**63 - 1,
) -> Fetched:
    """A ``TQR1`` or ``TQF1`` body (``ValueError`` if it breaks the layout) as an Arrow batch:
    of a ``TQF1`` body, the records of ``[start, end)`` (a ``TQR1`` body holds only those)."""
    if len(body) < _READ_HEAD.size:
        raise ValueError("not a TQR1 body: too short")
    magic, count, next_offset = _READ_HEAD.unpack_from(body)
    if magic == FRAMES_MAGIC and not include_headers:
        return _decode_frames(body, topic, partition, start, end)
    if magic != READ_MAGIC:
        raise ValueError(f"not a TQR1 body (magic {bytes(magic)!r})")
    buffer = pa.py_buffer(body)
    at = _READ_HEAD.size
    if at + 16 * count > len(body):
        raise ValueError("the TQR1 body ends inside the offsets")
    offsets = np.frombuffer(body, dtype="<i8", count=count, offset=at)
    offset_column = pa.Array.from_buffers(pa.int64(), count, [None, buffer.slice(at, 8 * count)])
    at += 8 * count
    timestamps_ms = np.frombuffer(body, dtype="<i8", count=count, offset=at)
    at += 8 * count
    micros = pa.py_buffer(timestamps_ms * 1000)
    timestamp_column = pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), count, [None, micros])
    keys, at = _binary(body, buffer, at, count, empty_is_null=True)
    values, at = _binary(body, buffer, at, count, empty_is_null=False)
    columns = [keys, values, offset_column, timestamp_column]
    if include_headers:
        raw_headers, at = _binary(body, buffer, at, count, empty_is_null=False)
        columns.append(_headers(raw_headers))
    return _fetched(columns, topic, partition, offsets, int(next_offset))


def _fetched(
    columns: list[pa.Array],
    topic: str,
    partition: int,
    offsets: np.ndarray[Any, np.dtype[np.int64]],
    next_offset: int,
) -> Fetched:
    """The batch of key, value, offset, timestamp (and headers) columns."""
    count = len(offsets)
    key, value, offset, timestamp, *headers = columns
    batch = pa.RecordBatch.from_arrays(
        [
            key,
            value,
            _constant_string(topic, count),
            pa.array(np.full(count, partition, dtype=np.int32)),
            offset,
            timestamp,
            pa.array(np.full(count, LOG_APPEND_TIME, dtype=np.int32)),
            *headers,
        ],
        schema=read_schema(bool(headers)),
    )
    return Fetched(batch, offsets, next_offset)


def _decode_frames(body: bytes, topic: str, partition: int, start: int, end: int) -> Fetched:
    """A ``TQF1`` body's records of ``[start, end)`` (no headers)."""
    _magic, count, next_offset = _READ_HEAD.unpack_from(body)
    if len(body) > _MAX_FRAMES_BODY:  # Arrow's 32-bit offsets address it
        raise ValueError(f"a TQF1 body of {len(body)} bytes: at most {_MAX_FRAMES_BODY}")
    body = _plain_frames(body, count)
    starts: list[int] = []  # where each record starts (a record: 8 bytes into its frame)
    frame_ends: list[int] = []
    sizes: list[int] = []  # records a frame
    bases: list[int] = []  # what a frame's records add their delta to
    add_start = starts.append
    u32 = _U32_BE.unpack_from
    at = _READ_HEAD.size
    try:
        for _ in range(count):
            length, _crc, first, _timestamp, flags = _FRAME_START.unpack_from(body, at)
            frame_end = at + 4 + length
            if first > _MAX_OFFSET:
                raise ValueError(f"a TQF1 body with offset {first}")
            if flags & _FLAG_BATCH:
                (entries,) = u32(body, at + 25)
                if not entries:
                    raise ValueError("a TQF1 body with an empty record batch")
                p = at + 29
                for _ in range(entries):
                    add_start(p)
                    p += 4 + u32(body, p)[0]
                if p != frame_end:
                    raise ValueError("a record batch whose entries do not fill it")
                sizes.append(entries)
                bases.append(first)
            else:
                add_start(at + 8)
                sizes.append(1)
                bases.append(first >> 32 << 32)
            frame_ends.append(frame_end)
            at = frame_end
    except struct.error as exc:
        raise ValueError(f"a TQF1 body whose frames are cut short: {exc}") from None
    if at != len(body):
        raise ValueError(f"{len(body) - at} bytes after the last frame of a TQF1 body")
    data = np.frombuffer(body, dtype=np.uint8)
    begin = np.array(starts, dtype=np.int64)
    finish = np.empty_like(begin)  # where each record ends: the next starts, or its frame ends
    finish[:-1] = begin[1:]
    finish[np.cumsum(sizes, dtype=np.int64) - 1] = frame_ends
    try:
        based = np.repeat(np.array(bases, dtype=np.int64), sizes)
        offsets = based + _big_endian(data, begin + _ENTRY_DELTA_AT, _BYTES_4, ">u4")
        timestamps_ms = _big_endian(data, begin + _ENTRY_TIMESTAMP_AT, _BYTES_8, ">u8")
        names = begin + _ENTRY_NAMES_AT
        key_length_at = names + 1 + data[names]
        key_at = key_length_at + 1
        key_end = key_at + data[key_length_at]
        value_at = key_end + 4 + _big_endian(data, key_end, _BYTES_4, ">u4")
    except IndexError:
        raise ValueError("a TQF1 body whose records point past its end") from None
    if len(offsets) and (np.any(np.diff(offsets) <= 0) or np.any(value_at > finish)):
        raise ValueError("a TQF1 body whose records overlap or are out of offset order")
    if np.any(offsets < based) or np.any(timestamps_ms < 0) or np.any(timestamps_ms > _MAX_MS):
        raise ValueError("a TQF1 body with an offset or a timestamp out of range")
    lo, hi = np.searchsorted(offsets, [start, end])
    cut = slice(int(lo), int(hi))
    offsets = offsets[cut]
    columns = [
        _slices(body, key_at[cut], key_end[cut], empty_is_null=True),
        _slices(body, value_at[cut], finish[cut], empty_is_null=False),
        pa.array(offsets),
        pa.array(timestamps_ms[cut] * 1000, pa.timestamp("us", tz="UTC")),
    ]
    return _fetched(columns, topic, partition, offsets, int(next_offset))


def _plain_frames(body: bytes, count: int) -> bytes:
    """``body`` with each Kafka producer's batch (format 3: maybe compressed, its records
    varint-coded) and each compressed format 2 batch rewritten as a plain record batch of the
    log's format 2, which the columns are cut from (its CRC left 0: the broker checked the
    frame's); ``body`` itself when it has none."""
    parts: list[bytes] = []
    at, copied = _READ_HEAD.size, 0
    try:
        for _ in range(count):
            length, _crc, first, timestamp, flags = _FRAME_START.unpack_from(body, at)
            frame_end = at + 4 + length
            if flags & _FLAG_BATCH and flags & (_FLAG_KAFKA | _FLAG_COMPRESSED):
                rest = body[at + 25 : frame_end]
                if flags & _FLAG_KAFKA:
                    batch = _as_format_2(rest, first, timestamp)
                else:
                    batch = _decompressed(rest, first, timestamp, flags & ~_FLAG_COMPRESSED)
                parts += (body[copied:at], batch)
                copied = frame_end
            at = frame_end
    except (struct.error, IndexError, ValueError) as exc:  # CompressionError is a ValueError
        raise ValueError(f"a TQF1 body whose frames do not decode: {exc}") from None
    if not parts:
        return body
    parts.append(body[copied:])
    return b"".join(parts)


def _decompressed(rest: bytes, first: int, timestamp: int, flags: int) -> bytes:
    entries = compression.decompress(rest[4], rest[5:], _MAX_FRAMES_BODY)
    plain = _FRAME_FIXED.pack(first, timestamp, flags) + rest[:4] + entries
    return _FRAME_HEAD.pack(len(plain) + 4, 0) + plain


def _as_format_2(rest: bytes, first: int, timestamp: int) -> bytes:
    exchange = rest[: 1 + rest[0]]
    batch = decode_batch(rest[len(exchange) :])
    entries = [_U32_BE.pack(len(batch.records))]
    for record in batch.records:
        key = record.key or b""
        value = record.value or b""
        middle = exchange + bytes((len(key),)) + key + b"\0\0\0\0"
        stamp = batch.base_timestamp + record.timestamp_delta
        length = _ENTRY_HEAD.size - 4 + len(middle) + len(value)
        entries += (_ENTRY_HEAD.pack(length, record.offset_delta, stamp, 1), middle, value)
    rest = _FRAME_FIXED.pack(first, timestamp, _FLAG_BATCH | 1) + b"".join(entries)
    return _FRAME_HEAD.pack(len(rest) + 4, 0) + rest


def _big_endian(
    data: np.ndarray[Any, np.dtype[np.uint8]],
    at: np.ndarray[Any, np.dtype[np.int64]],
    width: np.ndarray[Any, np.dtype[np.int64]],
    dtype: str,
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The big-endian unsigned integers at positions ``at`` (``len(width)`` bytes each)."""
    gathered = data[at[:, None] + width]
    return gathered.view(dtype).ravel().astype(np.int64)


def _slices(
    body: bytes,
    begin: np.ndarray[Any, np.dtype[np.int64]],
    finish: np.ndarray[Any, np.dtype[np.int64]],
    *,
    empty_is_null: bool,
) -> pa.Array:
    """``body[begin[i]:finish[i]]`` for each i, as a binary array, cut out by Arrow: the
    array whose items alternate between the slices and what lies between them, every other
    item taken (one ``take``, no loop per record). ``begin`` and ``finish`` increase."""
    count = len(begin)
    if not count:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * count, dtype=np.int32)
    bounds[0::2] = begin
    bounds[1::2] = finish
    if np.any(np.diff(bounds) < 0):
        raise ValueError("a TQF1 body whose records overlap")
    between = pa.Array.from_buffers(
        pa.binary(), 2 * count - 1, [None, pa.py_buffer(bounds), pa.py_buffer(body)]
    )
    taken = between.take(pa.array(np.arange(0, 2 * count, 2, dtype=np.int32)))
    present = finish > begin
    if empty_is_null and not present.all():
        _validity, offsets, data = taken.buffers()
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
        taken = pa.Array.from_buffers(
            pa.binary(), count, [validity, offsets, data], offset=taken.offset
        )
    return taken


def _binary(
    body: bytes, buffer: pa.Buffer, at: int, count: int, *, empty_is_null: bool
) -> tuple[pa.Array, int]:
    """The binary column at ``at``: ``i32 offsets[count + 1]`` then the bytes."""
    end = at + 4 * (count + 1)
    if end > len(body):
        raise ValueError("the TQR1 body ends inside a column's offsets")
    ends = np.frombuffer(body, dtype="<i4", count=count + 1, offset=at)
    size = int(ends[-1])
    if ends[0] != 0 or size < 0 or end + size > len(body):
        raise ValueError("a TQR1 column's offsets are out of bounds")
    if (buffer.address + at) % 4:  # Arrow wants aligned offsets: copy the (small) array
        offsets_buffer = pa.py_buffer(ends.copy())
    else:
        offsets_buffer = buffer.slice(at, 4 * (count + 1))
    validity = None
    if empty_is_null and count:
        present = np.diff(ends) > 0
        if not present.all():
            validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    array = pa.Array.from_buffers(
        pa.binary(), count, [validity, offsets_buffer, buffer.slice(end, size)]
    )
    array.validate(full=True)  # offsets that never decrease, within the data
    return array, end + size


def _constant_string(text: str, count: int) -> pa.Array:
    raw = text.encode()
    offsets = np.arange(count + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(raw * count)]
    )


def _headers(raw: pa.Array) -> pa.Array:
    """Each record's header JSON as a list of (key, value bytes); null for no headers."""
    names: list[str] = []
    values: list[bytes | None] = []
    ends = [0]
    missing = []
    for item in raw.to_pylist():
        table = json.loads(item) if item else None
        if table:
            for name, value in table.items():
                names.append(name)
                values.append(_header_bytes(value))
        missing.append(not table)
        ends.append(len(names))
    entries = pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(values, pa.binary())], fields=list(_HEADER_STRUCT)
    )
    return pa.ListArray.from_arrays(
        pa.array(ends, pa.int32()), entries, type=_HEADERS_TYPE, mask=pa.array(missing)
    )


def _header_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict) and list(value) == ["bytes"] and isinstance(value["bytes"], str):
        return base64.b64decode(value["bytes"])
    return json.dumps(value, separators=(",", ":")).encode()
