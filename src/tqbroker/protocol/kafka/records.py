"""Kafka's record batch, magic 2 (the protocol guide's "Record Batch"; Kafka's
``DefaultRecordBatch`` and ``DefaultRecord``), sans-IO.

A batch is a header (base offset, length, leader epoch, magic, a CRC-32C of everything after
the CRC field, attributes, the last offset delta, the first and largest timestamps, the
producer id, epoch and first sequence, the record count) and its records, each a varint
length, attributes, a timestamp delta, an offset delta, key, value and headers (a key a
string, a value bytes; null keys and values have length -1). ``decode_batches`` reads the
batches of a Produce request's or a Fetch response's ``records`` (a trailing partial batch, as
a Fetch may end with, is left out); ``encode_batch`` writes one. The records of a compressed
batch (attributes bits 0-2: gzip, snappy, lz4, zstd) are compressed as one
(``compression.py``); a batch over ``max_size`` once decompressed is ``CorruptBatch``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

import google_crc32c

from . import compression
from .wire import Malformed, Writer

MAGIC: Final = 2
# base offset i64, length i32, leader epoch i32, magic i8, crc u32
_PREFIX: Final = struct.Struct(">qiibI")
# attributes i16, last offset delta i32, base and max timestamps i64, producer id i64,
# producer epoch i16, base sequence i32, record count i32
_HEADER: Final = struct.Struct(">hiqqqhii")
HEADER_SIZE: Final = _PREFIX.size + _HEADER.size  # 61
LENGTH_OFFSET: Final = 8  # the length counts the bytes after it
CRC_START: Final = _PREFIX.size  # the CRC covers the attributes on

COMPRESSION_MASK: Final = 0x07
TIMESTAMP_TYPE_MASK: Final = 0x08  # set: LogAppendTime
TRANSACTIONAL_MASK: Final = 0x10
CONTROL_MASK: Final = 0x20
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_PARTITION_LEADER_EPOCH: Final = -1


class CorruptBatch(Malformed):
    """A batch whose CRC does not match its bytes, or whose layout is wrong (Kafka's
    ``CORRUPT_MESSAGE``, 2)."""


class UnsupportedMagic(Malformed):
    """A batch of magic 0 or 1 (Kafka's ``UNSUPPORTED_FOR_MESSAGE_FORMAT``, 43)."""


class UnsupportedCompression(Malformed):
    """A compressed batch whose codec this broker does not have (Kafka's
    ``UNSUPPORTED_COMPRESSION_TYPE``, 76)."""


class Header(NamedTuple):
    key: str
    value: bytes | None


class Record(NamedTuple):
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    attributes: int = 0


class RecordBatch(NamedTuple):
    base_offset: int
    records: tuple[Record, ...]
    base_timestamp: int
    max_timestamp: int
    attributes: int = 0
    last_offset_delta: int = -1  # -1: the records' last offset delta
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


# The most bytes a batch's records may decompress to, unless the caller says (Kafka bounds a
# batch by max.message.bytes, compressed; this bounds what one batch may cost to read).
MAX_DECOMPRESSED: Final = 64 * 1024 * 1024


def decode_batches(data: bytes, max_size: int = MAX_DECOMPRESSED) -> list[RecordBatch]:
    """Every whole batch in ``data`` (``CorruptBatch``, ``UnsupportedMagic``,
    ``UnsupportedCompression``)."""
    batches = []
    position = 0
    while len(data) - position >= _PREFIX.size:
        _base, length, _epoch, magic, _crc = _PREFIX.unpack_from(data, position)
        end = position + LENGTH_OFFSET + 4 + length
        if length < HEADER_SIZE - LENGTH_OFFSET - 4:
            raise CorruptBatch(f"a batch length of {length}")
        if magic != MAGIC:
            raise UnsupportedMagic(f"a batch of magic {magic}")
        if end > len(data):
            break  # a trailing partial batch
        batches.append(decode_batch(data[position:end], max_size))
        position = end
    return batches


class InvalidRecord(Malformed):
    """A record the caller's rules refuse (``check_batch``: a key or header name too long or
    not UTF-8; Kafka's ``INVALID_RECORD``, 87)."""


class RecordTooLarge(Malformed):
    """A record whose value is over the caller's limit (Kafka's ``MESSAGE_TOO_LARGE``, 10)."""


class BatchHeader(NamedTuple):
    """A batch's fixed fields (what a produce needs of it besides its bytes)."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK


def check_batch(
    data: bytes, *, max_value: int, max_name: int = 255, max_size: int = MAX_DECOMPRESSED
) -> BatchHeader:
    """One whole batch checked as a produce checks it, without building its records: the CRC
    and magic, the records (decompressed) laid out exactly, their offset deltas 0, 1, ... up
    to the last offset delta, each key and header name UTF-8 of at most ``max_name`` bytes
    (``InvalidRecord``), each value at most ``max_value`` bytes (``RecordTooLarge``).
    Control batches are ``InvalidRecord`` (no transactions here)."""
    if len(data) < HEADER_SIZE:
        raise CorruptBatch(f"a batch of {len(data)} bytes")
    base_offset, length, leader_epoch, magic, crc = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise UnsupportedMagic(f"a batch of magic {magic}")
    if LENGTH_OFFSET + 4 + length != len(data):
        raise CorruptBatch(f"a batch length of {length} in {len(data)} bytes")
    if google_crc32c.value(data[CRC_START:]) != crc:
        raise CorruptBatch("the batch's CRC does not match its bytes")
    header = BatchHeader(base_offset, leader_epoch, *_HEADER.unpack_from(data, _PREFIX.size))
    if header.attributes & CONTROL_MASK:
        raise InvalidRecord("a control batch (transactions are not served)")
    count = header.record_count
    if count < 1 or header.last_offset_delta != count - 1:
        raise CorruptBatch(f"{count} records and a last offset delta {header.last_offset_delta}")
    position = HEADER_SIZE
    codec = header.compression
    if codec:
        try:
            data, position = compression.decompress(codec, data[HEADER_SIZE:], max_size), 0
        except compression.UnknownCodec as exc:
            raise UnsupportedCompression(str(exc)) from None
        except compression.CompressionError as exc:
            raise CorruptBatch(str(exc)) from None
    if count > len(data) - position:
        raise CorruptBatch(f"{count} records in {len(data) - position} bytes")
    _check_records(data, position, count, max_value, max_name)
    return header


def _check_records(data: bytes, p: int, count: int, max_value: int, max_name: int) -> None:
    """``_decode_records``' walk, building nothing (the hot loop of a produce: each varint
    of one byte read in line)."""
    varint = _varint
    try:
        for expected in range(count):
            byte = data[p]
            if byte < 0x80:
                size, p = (byte >> 1) ^ -(byte & 1), p + 1
            else:
                size, p = varint(data, p)
            end = p + size
            if size < 0 or end > len(data):
                raise CorruptBatch(f"a record of {size} bytes in {len(data) - p}")
            byte = data[p + 1]  # after the attributes: the timestamp delta
            p = p + 2 if byte < 0x80 else varint(data, p + 1)[1]
            byte = data[p]  # the offset delta
            if byte < 0x80:
                delta, p = (byte >> 1) ^ -(byte & 1), p + 1
            else:
                delta, p = varint(data, p)
            if delta != expected:  # LogValidator: inner offsets in order from 0
                raise CorruptBatch(f"offset delta {delta} where {expected} belongs")
            byte = data[p]  # the key's length
            if byte < 0x80:
                size, p = (byte >> 1) ^ -(byte & 1), p + 1
            else:
                size, p = varint(data, p)
            if size > 0:
                key = data[p : p + size]
                if size > max_name:
                    raise InvalidRecord(f"a key of {size} bytes (at most {max_name})")
                if not key.isascii():
                    _text(key, "a key")
                p += size
            elif size < -1:
                raise CorruptBatch(f"a key length of {size}")
            byte = data[p]  # the value's length
            if byte < 0x80:
                size, p = (byte >> 1) ^ -(byte & 1), p + 1
            else:
                size, p = varint(data, p)
            if size > max_value:
                raise RecordTooLarge(f"a value of {size} bytes (at most {max_value})")
            if size > 0:
                p += size
            elif size < -1:
                raise CorruptBatch(f"a value length of {size}")
            if data[p] == 0:  # no headers: most records
                p += 1
            else:
                headers, p = _headers(data, p, end)
                for name, _value in headers:
                    if len(name.encode()) > max_name:
                        raise InvalidRecord(f"a header name over {max_name} bytes")
            if p != end:
                raise CorruptBatch("a record's length does not match its fields")
    except IndexError:
        raise CorruptBatch("records cut short") from None
    if p != len(data):
        raise CorruptBatch(f"{len(data) - p} bytes after the last record")


def _text(data: bytes, what: str) -> None:
    try:
        data.decode()
    except UnicodeDecodeError:
        raise InvalidRecord(f"{what} that is not UTF-8") from None


def split_batches(data: bytes) -> list[bytes]:
    """A Produce request's ``records``: its whole batches' bytes (``CorruptBatch`` for bytes
    that are not whole batches, ``UnsupportedMagic``)."""
    batches = []
    position = 0
    while position < len(data):
        if len(data) - position < _PREFIX.size:
            raise CorruptBatch(f"{len(data) - position} bytes after the last batch")
        _base, length, _epoch, magic, _crc = _PREFIX.unpack_from(data, position)
        if magic != MAGIC:
            raise UnsupportedMagic(f"a batch of magic {magic}")
        end = position + LENGTH_OFFSET + 4 + length
        if length < HEADER_SIZE - LENGTH_OFFSET - 4 or end > len(data):
            raise CorruptBatch(f"a batch length of {length}")
        batches.append(data[position:end])
        position = end
    return batches


def decode_batch(data: bytes, max_size: int = MAX_DECOMPRESSED) -> RecordBatch:
    """One whole batch, its CRC checked, its records decompressed."""
    if len(data) < HEADER_SIZE:
        raise CorruptBatch(f"a batch of {len(data)} bytes")
    base_offset, length, leader_epoch, magic, crc = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise UnsupportedMagic(f"a batch of magic {magic}")
    if LENGTH_OFFSET + 4 + length != len(data):
        raise CorruptBatch(f"a batch length of {length} in {len(data)} bytes")
    if google_crc32c.value(data[CRC_START:]) != crc:
        raise CorruptBatch("the batch's CRC does not match its bytes")
    (attributes, last_delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence, count) = (
        _HEADER.unpack_from(data, _PREFIX.size)
    )
    codec = attributes & COMPRESSION_MASK
    position = HEADER_SIZE
    if codec:
        try:
            data, position = compression.decompress(codec, data[HEADER_SIZE:], max_size), 0
        except compression.UnknownCodec as exc:
            raise UnsupportedCompression(str(exc)) from None
        except compression.CompressionError as exc:
            raise CorruptBatch(str(exc)) from None
    if count < 0 or count > len(data) - position:
        raise CorruptBatch(f"{count} records in {len(data) - position} bytes")
    records = _decode_records(data, position, count)
    return RecordBatch(
        base_offset,
        records,
        base_ts,
        max_ts,
        attributes,
        last_delta,
        leader_epoch,
        producer_id,
        producer_epoch,
        base_sequence,
    )


def _decode_records(data: bytes, position: int, count: int) -> tuple[Record, ...]:
    """``count`` records from ``position`` to the end of ``data`` (the hot loop of a produce:
    positions and slices, no reader object; a varint of one byte read in line)."""
    records: list[Record] = []
    append = records.append
    varint = _varint
    try:
        for _ in range(count):
            size, position = varint(data, position)
            end = position + size
            if size < 0 or end > len(data):
                raise CorruptBatch(f"a record of {size} bytes in {len(data) - position}")
            attributes = data[position]
            timestamp_delta, position = varint(data, position + 1)
            byte = data[position]
            if byte < 0x80:
                offset_delta, position = (byte >> 1) ^ -(byte & 1), position + 1
            else:
                offset_delta, position = varint(data, position)
            size, position = varint(data, position)
            if size >= 0:
                key: bytes | None = data[position : position + size]
                position += size
            elif size == -1:
                key = None
            else:
                raise CorruptBatch(f"a key length of {size}")
            size, position = varint(data, position)
            if size >= 0:
                value: bytes | None = data[position : position + size]
                position += size
            elif size == -1:
                value = None
            else:
                raise CorruptBatch(f"a value length of {size}")
            byte = data[position]
            if byte == 0:  # no headers: most records
                headers: tuple[Header, ...] = ()
                position += 1
            else:
                headers, position = _headers(data, position, end)
            if position != end:
                raise CorruptBatch("a record's length does not match its fields")
            append(
                Record(
                    offset_delta,
                    timestamp_delta,
                    key,
                    value,
                    headers,
                    attributes - 256 if attributes > 127 else attributes,
                )
            )
    except IndexError:
        raise CorruptBatch("records cut short") from None
    if position != len(data):
        raise CorruptBatch(f"{len(data) - position} bytes after the last record")
    return tuple(records)


def _headers(data: bytes, position: int, end: int) -> tuple[tuple[Header, ...], int]:
    count, position = _varint(data, position)
    if count < 0 or count > end - position:
        raise CorruptBatch(f"{count} headers in {end - position} bytes")
    headers = []
    for _ in range(count):
        size, position = _varint(data, position)
        if size < 0:
            raise CorruptBatch("a header without a key")
        name = data[position : position + size]
        size, position = _varint(data, position + size)
        if size >= 0:
            value: bytes | None = data[position : position + size]
            position += size
        elif size == -1:
            value = None
        else:
            raise CorruptBatch(f"a header value length of {size}")
        try:
            headers.append(Header(name.decode(), value))
        except UnicodeDecodeError as exc:
            raise CorruptBatch("a header key that is not UTF-8") from exc
    return tuple(headers), position


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """The zigzag varint at ``position`` and the position after it (``IndexError``: cut
    short)."""
    byte = data[position]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), position + 1
    value, shift = byte & 0x7F, 7
    while True:
        position += 1
        byte = data[position]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), position + 1
        shift += 7
        if shift > 63:
            raise CorruptBatch("a varint longer than 10 bytes")


def encode_batch(batch: RecordBatch) -> bytes:
    """The batch's bytes, its length and CRC computed, its records compressed with the codec
    its attributes name."""
    body = Writer()
    for record in batch.records:
        body.raw(_encode_record(record))
    records = body.getvalue()
    if batch.compression:
        try:
            records = compression.compress(batch.compression, records)
        except compression.UnknownCodec as exc:
            raise UnsupportedCompression(str(exc)) from None
    last_delta = batch.last_offset_delta
    if last_delta < 0:
        last_delta = batch.records[-1].offset_delta if batch.records else 0
    after_crc = (
        _HEADER.pack(
            batch.attributes,
            last_delta,
            batch.base_timestamp,
            batch.max_timestamp,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            len(batch.records),
        )
        + records
    )
    length = len(after_crc) + _PREFIX.size - LENGTH_OFFSET - 4
    crc = google_crc32c.value(after_crc)
    prefix = _PREFIX.pack(batch.base_offset, length, batch.partition_leader_epoch, MAGIC, crc)
    return prefix + after_crc


def _encode_record(record: Record) -> bytes:
    fields = Writer()
    fields.int8(record.attributes)
    fields.varint(record.timestamp_delta)
    fields.varint(record.offset_delta)
    _write_nullable(fields, record.key)
    _write_nullable(fields, record.value)
    fields.varint(len(record.headers))
    for header in record.headers:
        _write_nullable(fields, header.key.encode())
        _write_nullable(fields, header.value)
    out = Writer()
    out.varint(len(fields.buffer))
    out.raw(fields.buffer)
    return out.getvalue()


def _write_nullable(writer: Writer, data: bytes | None) -> None:
    if data is None:
        writer.varint(-1)
    else:
        writer.varint(len(data))
        writer.raw(data)


def batch_of(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[Header], int]],
    base_offset: int,
) -> RecordBatch:
    """A batch of ``(key, value, headers, timestamp_ms)`` at consecutive offsets from
    ``base_offset`` (a Fetch response's, for records not stored as Kafka batches)."""
    base_ts = records[0][3] if records else -1
    made = tuple(
        Record(n, ts - base_ts, key, value, tuple(headers))
        for n, (key, value, headers, ts) in enumerate(records)
    )
    max_ts = max((r[3] for r in records), default=-1)
    return RecordBatch(base_offset, made, base_ts, max_ts)
