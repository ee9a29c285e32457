"""The bulk record formats of the HTTP topic API: columnar, so a reader can wrap the columns as
Arrow arrays without a loop per record (the Spark data source does). Sans-IO: bytes in and out.

Responsibilities:
- ``ReadBatch`` / ``encode_read`` (``encode_read_parts``: from the items, one copy) /
  ``decode_read``: what ``GET /topics/{t}/partitions/{p}/records``
  returns — ``b"TQR1"``, ``u32 count``, ``i64 next_offset``, ``i64 offsets[count]``,
  ``i64 timestamps_ms[count]``, then the keys, the values and (when asked for) the headers as
  binary columns: ``i32 ends_offsets[count + 1]`` followed by the bytes;
- ``encode_frames`` (``frames_head``: its start): the same read as the log's frames as they
  lie on disk (``format=frames``) — ``b"TQF1"``, ``u32 frame_count``, ``i64 next_offset``,
  then the frames (``docs/storage-format.md``: records and record batches, big-endian,
  CRC-checked by the broker); the reader walks them (``spark._arrow_read`` does, into Arrow
  columns) and skips the records outside the range it asked for;
- ``WriteBatch`` / ``encode_write`` / ``decode_write``: what ``POST /topics/{t}/records`` takes —
  ``b"TQW1"``, ``u32 count``, ``i32 partitions[count]`` (-1: the key decides), then the keys, the
  values and the headers (a UTF-8 JSON object per record, empty for none) as binary columns;
- ``json_value`` / ``encode_headers``: AMQP header values as JSON (byte arrays as
  ``{"bytes": <base64>}``, non-finite floats and undecodable text as strings), for these
  batches and the JSON endpoints alike.

Integers are little-endian (Arrow's byte order), but inside the frames (big-endian, as on
disk). A binary column's offsets start at 0 and never decrease; ``decode_*`` raise
``ValueError`` for bodies that break the layout.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import itertools
import json
import math
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from .protocol.codec import FieldTable, FieldValue, Timestamp

READ_MAGIC = b"TQR1"
FRAMES_MAGIC = b"TQF1"
WRITE_MAGIC = b"TQW1"
_READ_HEAD = struct.Struct("<4sIq")
_WRITE_HEAD = struct.Struct("<4sI")
_LITTLE = sys.byteorder == "little"


def _pack(values: array) -> bytes:  # type: ignore[type-arg]
    if not _LITTLE:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _unpack(typecode: str, raw: memoryview) -> array:  # type: ignore[type-arg]
    values = array(typecode)
    values.frombytes(raw)
    if not _LITTLE:
        values.byteswap()
    return values


@attrs.frozen
class BinaryColumn:
    """Byte strings as one buffer and ``count + 1`` offsets into it (Arrow's binary layout)."""

    offsets: array  # type: ignore[type-arg]  # 'i'
    data: bytes

    @classmethod
    def of(cls, items: Sequence[bytes]) -> BinaryColumn:
        return cls.lengths(map(len, items), b"".join(items))

    @classmethod
    def lengths(cls, lengths: Iterable[int], data: bytes) -> BinaryColumn:
        """The column of ``data`` cut into pieces of ``lengths`` bytes (adding up to it)."""
        offsets = array("i", [0])
        offsets.extend(itertools.accumulate(lengths))
        return cls(offsets, data)

    def __getitem__(self, i: int) -> bytes:
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def encode(self) -> bytes:
        return _pack(self.offsets) + self.data

    @classmethod
    def decode(cls, view: memoryview, at: int, count: int) -> tuple[BinaryColumn, int]:
        end = at + 4 * (count + 1)
        if end > len(view):
            raise ValueError("the body ends inside a column's offsets")
        offsets = _unpack("i", view[at:end])
        if offsets[0] != 0 or any(b < a for a, b in itertools.pairwise(offsets)):
            raise ValueError("a column's offsets must start at 0 and never decrease")
        stop = end + offsets[-1]
        if stop > len(view):
            raise ValueError("the body ends inside a column's data")
        return cls(offsets, bytes(view[end:stop])), stop


@attrs.frozen
class ReadBatch:
    next_offset: int
    offsets: array  # type: ignore[type-arg]  # 'q'
    timestamps_ms: array  # type: ignore[type-arg]  # 'q'
    keys: BinaryColumn
    values: BinaryColumn
    headers: BinaryColumn | None  # JSON objects, when asked for

    def __len__(self) -> int:
        return len(self.offsets)


def encode_read(batch: ReadBatch) -> bytes:
    parts = [
        _READ_HEAD.pack(READ_MAGIC, len(batch), batch.next_offset),
        _pack(batch.offsets),
        _pack(batch.timestamps_ms),
        batch.keys.encode(),
        batch.values.encode(),
    ]
    if batch.headers is not None:
        parts.append(batch.headers.encode())
    return b"".join(parts)


def encode_read_parts(
    next_offset: int,
    offsets: array,  # type: ignore[type-arg]
    timestamps_ms: array,  # type: ignore[type-arg]
    columns: Sequence[tuple[Iterable[int], Sequence[bytes | memoryview]]],
) -> bytes:
    """``encode_read`` of columns given as (each item's length, pieces that make up the data):
    the pieces are copied once, straight into the body (a body of several MiB built in steps
    costs a page fault every 4 KiB of each step's copy)."""
    parts: list[bytes | memoryview] = [
        _READ_HEAD.pack(READ_MAGIC, len(offsets), next_offset),
        _pack(offsets),
        _pack(timestamps_ms),
    ]
    for lengths, pieces in columns:
        ends = array("i", [0])
        ends.extend(itertools.accumulate(lengths))
        parts.append(_pack(ends))
        parts.extend(pieces)
    return b"".join(parts)


def decode_read(body: bytes, *, headers: bool) -> ReadBatch:
    view = memoryview(body)
    if len(view) < _READ_HEAD.size:
        raise ValueError("not a TQR1 body: too short")
    magic, count, next_offset = _READ_HEAD.unpack_from(view)
    if magic != READ_MAGIC:
        raise ValueError(f"not a TQR1 body (magic {bytes(magic)!r})")
    at = _READ_HEAD.size
    end = at + 16 * count
    if end > len(view):
        raise ValueError("the body ends inside the offsets")
    offsets = _unpack("q", view[at : at + 8 * count])
    timestamps = _unpack("q", view[at + 8 * count : end])
    keys, at = BinaryColumn.decode(view, end, count)
    values, at = BinaryColumn.decode(view, at, count)
    header_column = None
    if headers:
        header_column, at = BinaryColumn.decode(view, at, count)
    return ReadBatch(next_offset, offsets, timestamps, keys, values, header_column)


def encode_frames(next_offset: int, frames: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A ``TQF1`` body: the frames given as (head, rest) pairs, copied once into it."""
    parts = [frames_head(len(frames), next_offset)]
    parts.extend(itertools.chain.from_iterable(frames))
    return b"".join(parts)


def frames_head(count: int, next_offset: int) -> bytes:
    """The start of a ``TQF1`` body of ``count`` frames (they follow it: a body streamed a
    piece at a time sends this first)."""
    return _READ_HEAD.pack(FRAMES_MAGIC, count, next_offset)


@attrs.frozen
class WriteBatch:
    partitions: array  # type: ignore[type-arg]  # 'i': -1 = by key
    keys: BinaryColumn
    values: BinaryColumn
    headers: BinaryColumn  # a JSON object per record, or empty

    def __len__(self) -> int:
        return len(self.partitions)


def encode_write(batch: WriteBatch) -> bytes:
    return b"".join(
        (
            _WRITE_HEAD.pack(WRITE_MAGIC, len(batch)),
            _pack(batch.partitions),
            batch.keys.encode(),
            batch.values.encode(),
            batch.headers.encode(),
        )
    )


def decode_write(body: bytes) -> WriteBatch:
    view = memoryview(body)
    if len(view) < _WRITE_HEAD.size:
        raise ValueError("not a TQW1 body: too short")
    magic, count = _WRITE_HEAD.unpack_from(view)
    if magic != WRITE_MAGIC:
        raise ValueError(f"not a TQW1 body (magic {bytes(magic)!r})")
    at = _WRITE_HEAD.size
    end = at + 4 * count
    if end > len(view):
        raise ValueError("the body ends inside the partitions")
    partitions = _unpack("i", view[at:end])
    keys, at = BinaryColumn.decode(view, end, count)
    values, at = BinaryColumn.decode(view, at, count)
    headers, at = BinaryColumn.decode(view, at, count)
    if at != len(view):
        raise ValueError(f"{len(view) - at} bytes after the last column")
    return WriteBatch(partitions, keys, values, headers)


def json_value(value: FieldValue) -> Any:
    """An AMQP field value as JSON can carry it."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):  # undecodable text (kept by surrogateescape) is shown replaced
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, bytes | bytearray):  # a byte array ('x'): unambiguous, in base64
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, Timestamp):  # past year 9999: no ISO-8601 text, the seconds
        return value.seconds
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    return str(value)


def encode_headers(headers: FieldTable | None) -> bytes:
    """A message's headers as a UTF-8 JSON object (``b"{}"`` for none)."""
    return json.dumps(json_value(headers or {}), separators=(",", ":")).encode()
