"""The byte layout of log records and index entries (``docs/storage-format.md`` is the grammar).

Responsibilities:
- encode a message as one record: ``length u32 | crc32c u32 | offset u64 | timestamp_ms u64 |
  flags u8 | exchange shortstr | routing_key shortstr | properties_length u32 | properties |
  body``, where ``length`` counts everything after itself and the CRC-32C (Castagnoli) covers
  everything after the CRC;
- decode and validate a record from a buffer (``RecordError`` for a bad length or CRC, ``None``
  when the buffer holds only part of one); ``parse_record`` decodes a record known to be sound
  (no CRC); the message decoded carries the record's timestamp;
- the index entry layouts: offset index ``relative_offset u32 | position u32``, time index
  ``timestamp_ms u64 | relative_offset u32``.
"""

from __future__ import annotations

import struct

import google_crc32c

from ...model import Message

RECORD_HEAD = struct.Struct(">II")  # length, crc
RECORD_FIXED = struct.Struct(">QQB")  # offset, timestamp_ms, flags
HEAD_SIZE = RECORD_HEAD.size
FIXED_SIZE = RECORD_FIXED.size
MIN_RECORD = HEAD_SIZE + FIXED_SIZE + 1 + 1 + 4  # two empty shortstrs, empty properties
# No record is larger than the broker's hard message cap plus its envelope.
MAX_RECORD = 512 * 1024 * 1024 + 1024

FLAG_PERSISTENT = 0x01

INDEX_ENTRY = struct.Struct(">II")  # relative offset, file position
TIME_ENTRY = struct.Struct(">QI")  # timestamp ms, relative offset
_U32 = struct.Struct(">I")


class RecordError(Exception):
    """Bytes that are not a valid record (torn write, garbage, flipped bit)."""


def encode_record(offset: int, timestamp_ms: int, flags: int, message: Message) -> bytes:
    exchange = message.exchange.encode()
    routing_key = message.routing_key.encode()
    props = message.properties_raw
    rest = b"".join(
        (
            RECORD_FIXED.pack(offset, timestamp_ms, flags),
            bytes((len(exchange),)),
            exchange,
            bytes((len(routing_key),)),
            routing_key,
            _U32.pack(len(props)),
            props,
            message.body,
        )
    )
    return RECORD_HEAD.pack(len(rest) + 4, google_crc32c.value(rest)) + rest


class Record:
    """A decoded record."""

    __slots__ = ("flags", "message", "offset", "size", "timestamp_ms")

    def __init__(
        self, offset: int, timestamp_ms: int, flags: int, message: Message, size: int
    ) -> None:
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.flags = flags
        self.message = message
        self.size = size  # bytes on disk, head included

    @property
    def persistent(self) -> bool:
        return bool(self.flags & FLAG_PERSISTENT)


def decode_record(buf: bytes | bytearray | memoryview, pos: int) -> Record | None:
    """The record starting at ``pos``; ``None`` if ``buf`` ends before it does. Checks the
    length and the CRC (``RecordError``)."""
    if len(buf) - pos < HEAD_SIZE:
        return None
    length, crc = RECORD_HEAD.unpack_from(buf, pos)
    if length < MIN_RECORD - 4 or length > MAX_RECORD:
        raise RecordError(f"impossible record length {length}")
    end = pos + 4 + length
    if end > len(buf):
        return None
    rest = bytes(buf[pos + HEAD_SIZE : end])
    if google_crc32c.value(rest) != crc:
        raise RecordError("CRC-32C mismatch")
    return _parse(rest, 0, end - pos)


def parse_record(record: bytes) -> Record:
    """Decode one whole record (as ``encode_record`` made it) known to be sound: one this
    process encoded and kept in memory. No CRC check."""
    return _parse(record, HEAD_SIZE, len(record))


def _parse(record: bytes, start: int, size: int) -> Record:
    """The record whose fixed fields start at ``record[start]`` (``size``: its whole length)."""
    try:
        offset, timestamp_ms, flags = RECORD_FIXED.unpack_from(record, start)
        p = start + FIXED_SIZE
        n = record[p]
        exchange = record[p + 1 : p + 1 + n].decode()
        p += 1 + n
        n = record[p]
        routing_key = record[p + 1 : p + 1 + n].decode()
        p += 1 + n
        (n,) = _U32.unpack_from(record, p)
        p += 4
        props = record[p : p + n]
        if len(props) != n:
            raise RecordError("properties past the end of the record")
        body = record[p + n :]
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise RecordError(f"malformed record: {exc}") from None
    message = Message(exchange, routing_key, props, body, timestamp_ms=timestamp_ms)
    return Record(offset, timestamp_ms, flags, message, size)
