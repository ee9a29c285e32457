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
from .wire import Malformed, Reader, Writer

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
    if codec:
        try:
            reader = Reader(compression.decompress(codec, data[HEADER_SIZE:], max_size), 0)
        except compression.UnknownCodec as exc:
            raise UnsupportedCompression(str(exc)) from None
        except compression.CompressionError as exc:
            raise CorruptBatch(str(exc)) from None
    else:
        reader = Reader(data, HEADER_SIZE)
    if count < 0 or count > reader.remaining:
        raise CorruptBatch(f"{count} records in {reader.remaining} bytes")
    records = tuple(_decode_record(reader) for _ in range(count))
    if reader.remaining:
        raise CorruptBatch(f"{reader.remaining} bytes after the last record")
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


def _decode_record(reader: Reader) -> Record:
    size = reader.varint()
    if size < 0 or size > reader.remaining:
        raise CorruptBatch(f"a record of {size} bytes in {reader.remaining}")
    end = reader.offset + size
    attributes = reader.int8()
    timestamp_delta = reader.varint()
    offset_delta = reader.varint()
    key = _nullable_bytes(reader)
    value = _nullable_bytes(reader)
    count = reader.varint()
    if count < 0 or count > reader.remaining:
        raise CorruptBatch(f"{count} headers in {reader.remaining} bytes")
    headers = []
    for _ in range(count):
        name = _nullable_bytes(reader)
        if name is None:
            raise CorruptBatch("a header without a key")
        try:
            headers.append(Header(name.decode(), _nullable_bytes(reader)))
        except UnicodeDecodeError as exc:
            raise CorruptBatch("a header key that is not UTF-8") from exc
    if reader.offset != end:
        raise CorruptBatch("a record's length does not match its fields")
    return Record(offset_delta, timestamp_delta, key, value, tuple(headers), attributes)


def _nullable_bytes(reader: Reader) -> bytes | None:
    size = reader.varint()
    if size < -1:
        raise CorruptBatch(f"a length of {size}")
    return None if size == -1 else reader.raw(size)


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
