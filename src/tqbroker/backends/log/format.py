"""The byte layout of log frames and index entries (``docs/storage-format.md`` is the grammar).

A log file is a sequence of *frames*, each ``length u32 | crc32c u32 | offset u64 |
timestamp_ms u64 | flags u8 | ...``, where ``length`` counts everything after itself and the
CRC-32C (Castagnoli) covers everything after the CRC. A frame is one of:

- a *record* (format 1, every log): one message, ``... | exchange shortstr | routing_key
  shortstr | properties_length u32 | properties | body``;
- a *record batch* (format 2, streams; flag ``FLAG_BATCH``): Kafka's record batch, many
  messages under one header and one CRC, ``offset`` the first record's, ``timestamp_ms`` the
  greatest, then ``count u32`` and the entries ``entry_length u32 | offset_delta u32 |
  timestamp_ms u64 | flags u8 | exchange | routing_key | properties_length u32 | properties |
  body``; with ``FLAG_COMPRESSED`` (a stream's ``x-stream-compression-type``), ``count u32 |
  codec u8 | the entries compressed`` (Kafka's codec ids);
- a *Kafka batch* (format 3, streams; flags ``FLAG_BATCH | FLAG_KAFKA``): a Kafka producer's
  record batch as it was produced (maybe compressed), ``... | exchange shortstr | batch``, its
  base offset the frame's; read back as the messages a Kafka produce makes
  (``backends.kafka_batches``).

Responsibilities: encode a record (``encode_record``), a batch (``encode_batch``) or a Kafka
batch (``encode_kafka_frame``); decode and
validate a frame from a buffer (``decode_frame``: ``RecordError`` for a bad length or CRC,
``None`` when the buffer holds only part of one), or a frame known to be sound without its CRC
(``parse_frame``); the index entry layouts (offset index ``relative_offset u32 | position
u32``, time index ``timestamp_ms u64 | relative_offset u32``).

Over 400 lines as one job: the byte layout, encoder and decoder side by side, so that a change
to a field is made once for writing and reading.
"""

from __future__ import annotations

import struct
from operator import itemgetter

import google_crc32c

from ...model import Message
from ...protocol.kafka import compression
from ...protocol.kafka.records import decode_batch
from ..kafka_batches import record_messages, with_base_offset

RECORD_HEAD = struct.Struct(">II")  # length, crc
RECORD_FIXED = struct.Struct(">QQB")  # offset, timestamp_ms, flags
HEAD_SIZE = RECORD_HEAD.size
FIXED_SIZE = RECORD_FIXED.size
MIN_RECORD = HEAD_SIZE + FIXED_SIZE + 1 + 1 + 4  # two empty shortstrs, empty properties
# No record is larger than the broker's hard message cap plus its envelope.
MAX_RECORD = 512 * 1024 * 1024 + 1024

FLAG_PERSISTENT = 0x01
FLAG_BATCH = 0x80  # the frame is a record batch (format 2)
FLAG_KAFKA = 0x40  # with FLAG_BATCH: the batch is a Kafka record batch (format 3)
FLAG_COMPRESSED = 0x20  # with FLAG_BATCH: the entries are compressed (format 2, compressed)
KAFKA_FLAGS = FLAG_BATCH | FLAG_KAFKA | FLAG_PERSISTENT

BATCH_COUNT = struct.Struct(">I")
ENTRY_HEAD = struct.Struct(">IIQB")  # entry_length, offset_delta, timestamp_ms, flags
BATCH_OVERHEAD = HEAD_SIZE + FIXED_SIZE + BATCH_COUNT.size  # a batch's bytes besides entries
ENTRY_OVERHEAD = ENTRY_HEAD.size + 1 + 1 + 4  # an entry's bytes besides names, props and body

INDEX_ENTRY = struct.Struct(">II")  # relative offset, file position
TIME_ENTRY = struct.Struct(">QI")  # timestamp ms, relative offset
_U32 = struct.Struct(">I")
_first = itemgetter(0)
_crc = google_crc32c.value
_crc_extend = google_crc32c.extend
# The most (exchange, routing key) pairs whose stored form is memoised (all forgotten past it).
NAMES_MEMO_SIZE = 4096
_NAMES: dict[tuple[str, str], bytes] = {}


class RecordError(Exception):
    """Bytes that are not a valid record (torn write, garbage, flipped bit)."""


def encode_record(offset: int, timestamp_ms: int, flags: int, message: Message) -> bytes:
    props = message.properties_raw
    head = (
        RECORD_FIXED.pack(offset, timestamp_ms, flags)
        + _names(message.exchange, message.routing_key)
        + _U32.pack(len(props))
        + props
    )
    body = message.body
    crc = _crc_extend(_crc(head), body)  # the body is copied once, by the join
    return b"".join((RECORD_HEAD.pack(len(head) + len(body) + 4, crc), head, body))


def _names(exchange: str, routing_key: str) -> bytes:
    """The exchange and routing key as a record stores them (two shortstrs), memoised: most
    records repeat a few."""
    key = (exchange, routing_key)
    names = _NAMES.get(key)
    if names is None:
        exchange_raw = exchange.encode()
        routing_key_raw = routing_key.encode()
        names = (
            bytes((len(exchange_raw),))
            + exchange_raw
            + bytes((len(routing_key_raw),))
            + routing_key_raw
        )
        if len(_NAMES) >= NAMES_MEMO_SIZE:
            _NAMES.clear()
        _NAMES[key] = names
    return names


class Record:
    """A decoded record: its fixed fields, and where its message's parts lie in the bytes of
    its frame. The ``Message`` is built on first use (a reader that only copies the parts out,
    a stream delivery or the bulk read, never builds one)."""

    __slots__ = (
        "_body_at",
        "_end",
        "_frame",
        "_message",
        "_names_at",
        "_properties_at",
        "_view",
        "flags",
        "offset",
        "size",
        "timestamp_ms",
    )

    def __init__(
        self,
        offset: int,
        timestamp_ms: int,
        flags: int,
        frame: bytes,
        view: memoryview,
        names_at: int,
        properties_at: int,
        body_at: int,
        end: int,
        size: int,
    ) -> None:
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.flags = flags
        self.size = size  # bytes on disk, head included
        self._frame = frame
        self._view = view  # of ``frame``: one for all the records of a batch
        self._names_at = names_at  # exchange shortstr, routing key shortstr
        self._properties_at = properties_at
        self._body_at = body_at
        self._end = end
        self._message: Message | None = None

    @property
    def message(self) -> Message:
        message = self._message
        if message is None:
            frame, p, body_at = self._frame, self._names_at, self._body_at
            n = frame[p]
            exchange = frame[p + 1 : p + 1 + n].decode()
            p += 1 + n
            routing_key = frame[p + 1 : p + 1 + frame[p]].decode()
            message = self._message = Message(
                exchange,
                routing_key,
                frame[self._properties_at : body_at],
                frame[body_at : self._end],
                timestamp_ms=self.timestamp_ms,
            )
        return message

    def parts(self) -> tuple[bytes, bytes, memoryview]:
        """The message's exchange and routing key as two shortstrs (as ``basic.deliver``
        carries them), its properties as published, and its body (a view of the frame)."""
        frame, properties_at, body_at = self._frame, self._properties_at, self._body_at
        return (
            frame[self._names_at : properties_at - 4],
            frame[properties_at:body_at],
            self._view[body_at : self._end],
        )

    @property
    def key_and_value(self) -> tuple[bytes, memoryview]:
        """The routing key (UTF-8) and the body (a view of the frame)."""
        frame, p, body_at = self._frame, self._names_at, self._body_at
        p += 1 + frame[p]
        return frame[p + 1 : p + 1 + frame[p]], self._view[body_at : self._end]

    @property
    def persistent(self) -> bool:
        return bool(self.flags & FLAG_PERSISTENT)

    # A record is a frame of its own (see ``Frame``).
    @property
    def last_offset(self) -> int:
        return self.offset

    @property
    def records(self) -> tuple[Record]:
        return (self,)


class Batch:
    """A decoded record batch: its records in offset order."""

    __slots__ = ("offset", "records", "size", "timestamp_ms")

    def __init__(self, offset: int, timestamp_ms: int, records: list[Record], size: int) -> None:
        self.offset = offset  # the first record's
        self.timestamp_ms = timestamp_ms  # the greatest of its records'
        self.records = records
        self.size = size  # bytes on disk, head included

    @property
    def last_offset(self) -> int:
        return self.records[-1].offset


# What a position in a log file holds: one record, or a batch of them. Both have ``offset``
# (the first), ``last_offset``, ``timestamp_ms`` (the greatest), ``size`` and ``records``.
Frame = Record | Batch


def first_at_or_after(frame: Frame, offset: int) -> int | None:
    """The index in ``frame.records`` of the first record at or after ``offset``."""
    records = frame.records
    i = offset - frame.offset
    if i <= 0:
        return 0
    if i < len(records) and records[i].offset == offset:
        return i  # no gap before it (a batch is never compacted in place)
    for j, record in enumerate(records):
        if record.offset >= offset:
            return j
    return None


def records_after(frame: Frame, record: Record, end: int, limit: int) -> list[Record]:
    """The records of ``frame`` after ``record`` (one of them: else none), below ``end``, at
    most ``limit``: the rest of a batch, for a bulk read."""
    records = frame.records
    i = first_at_or_after(frame, record.offset + 1)
    if i is None or records[i - 1] is not record:
        return []
    taken = list(records[i : i + limit])
    if taken and taken[-1].offset >= end:
        taken = [r for r in taken if r.offset < end]
    return taken


def encode_batch(
    base_offset: int, entries: list[tuple[int, int, Message]], codec: int = 0
) -> bytes:
    """A record batch of ``entries`` (``(timestamp_ms, flags, message)``), offsets from
    ``base_offset`` on; its entries compressed with ``codec`` (Kafka's ids) unless that does
    not make them smaller."""
    parts: list[bytes] = [b""]
    extend = parts.extend
    pack_entry = ENTRY_HEAD.pack
    pack_u32 = _U32.pack
    fixed = ENTRY_HEAD.size - 4  # an entry's length counts from offset_delta on
    # What comes between an entry's head and its body (names, properties), kept while
    # entries share their names and properties (a run of publishes does).
    last_exchange = last_routing_key = ""
    last_props: bytes | None = None  # none yet: the first entry makes its middle
    middle = b""
    for delta, (timestamp_ms, flags, message) in enumerate(entries):
        props, exchange, routing_key = message.properties_raw, message.exchange, message.routing_key
        if (
            props is not last_props
            or exchange is not last_exchange
            or routing_key is not last_routing_key
        ):
            last_props, last_exchange, last_routing_key = props, exchange, routing_key
            middle = _names(exchange, routing_key) + pack_u32(len(props)) + props
        body = message.body
        length = fixed + len(middle) + len(body)
        extend((pack_entry(length, delta, timestamp_ms, flags), middle, body))
    max_timestamp = max(map(_first, entries))
    flags = FLAG_BATCH | FLAG_PERSISTENT
    if codec:
        plain = b"".join(parts)
        packed = compression.compress(codec, plain)
        if len(packed) + 1 < len(plain):
            flags |= FLAG_COMPRESSED
            parts = [b"", bytes((codec,)), packed]
    parts[0] = RECORD_FIXED.pack(base_offset, max_timestamp, flags) + BATCH_COUNT.pack(len(entries))
    rest = b"".join(parts)
    return RECORD_HEAD.pack(len(rest) + 4, google_crc32c.value(rest)) + rest


def encode_kafka_frame(offset: int, timestamp_ms: int, exchange: str, batch: bytes) -> bytes:
    """A Kafka record batch (its bytes as produced) as a frame at ``offset``, its records'
    greatest timestamp ``timestamp_ms``, published to ``exchange``."""
    name = exchange.encode()
    rest = b"".join(
        (
            RECORD_FIXED.pack(offset, timestamp_ms, KAFKA_FLAGS),
            bytes((len(name),)),
            name,
            with_base_offset(batch, offset),
        )
    )
    return RECORD_HEAD.pack(len(rest) + 4, _crc(rest)) + rest


def kafka_batch_of(rest: bytes | memoryview) -> memoryview | None:
    """The Kafka batch in a frame's bytes after its CRC (``rest``), as produced; None when the
    frame is not a Kafka batch."""
    if rest[FIXED_SIZE - 1] & FLAG_KAFKA == 0:
        return None
    return memoryview(rest)[FIXED_SIZE + 1 + rest[FIXED_SIZE] :]


def decode_frame(buf: bytes | bytearray | memoryview, pos: int) -> Frame | None:
    """The frame starting at ``pos``; ``None`` if ``buf`` ends before it does. Checks the
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
    return _parse_frame(rest, 0, end - pos)


def decode_record(buf: bytes | bytearray | memoryview, pos: int) -> Record | None:
    """``decode_frame`` for files that hold single records only (memory-backend pages)."""
    frame = decode_frame(buf, pos)
    if isinstance(frame, Batch):
        raise RecordError("a record batch where a single record belongs")
    return frame


def parse_frame(frame: bytes) -> Frame:
    """Decode one whole frame known to be sound (one this process encoded and kept in
    memory): no CRC check."""
    return _parse_frame(frame, HEAD_SIZE, len(frame))


def parse_record(record: bytes) -> Record:
    """``parse_frame`` of a single record."""
    return _parse(record, HEAD_SIZE, len(record))


def _parse_frame(frame: bytes, start: int, size: int) -> Frame:
    if len(frame) > start + FIXED_SIZE - 1 and frame[start + FIXED_SIZE - 1] & FLAG_BATCH:
        if frame[start + FIXED_SIZE - 1] & FLAG_KAFKA:
            return _parse_kafka_batch(frame, start, size)
        return _parse_batch(frame, start, size)
    return _parse(frame, start, size)


def _parse_kafka_batch(frame: bytes, start: int, size: int) -> Batch:
    """A Kafka batch's records, each as the message a Kafka produce makes of it (over the
    bytes of one record each, laid out as a record's are after its fixed fields)."""
    try:
        base, max_timestamp, _flags = RECORD_FIXED.unpack_from(frame, start)
        p = start + FIXED_SIZE
        exchange = frame[p + 1 : p + 1 + frame[p]].decode()
        batch = decode_batch(frame[p + 1 + frame[p] :])
        if batch.base_offset != base or not batch.records:
            raise RecordError("a Kafka batch at another offset than its frame's, or empty")
        records: list[Record] = []
        share = max(size // len(batch.records), 1)  # the bytes on disk, shared out
        least = 0
        pack_u32 = _U32.pack
        for delta, message in record_messages(exchange, batch):
            if delta < least:
                raise RecordError("a Kafka batch whose offsets do not increase")
            least = delta + 1
            names = _names(exchange, message.routing_key)
            props = message.properties_raw
            data = b"".join((names, pack_u32(len(props)), props, message.body))
            properties_at = len(names) + 4
            record = Record(
                base + delta,
                message.timestamp_ms,
                FLAG_PERSISTENT,
                data,
                memoryview(data),
                0,
                properties_at,
                properties_at + len(props),
                len(data),
                share,
            )
            record._message = message
            records.append(record)
    except (IndexError, struct.error, ValueError) as exc:  # Malformed, UnicodeDecodeError
        raise RecordError(f"malformed Kafka batch: {exc}") from None
    return Batch(base, max_timestamp, records, size)


def _parse_batch(frame: bytes, start: int, size: int) -> Batch:
    if frame[start + FIXED_SIZE - 1] & FLAG_COMPRESSED:
        frame, start = _decompressed(frame, start), 0
    try:
        base, max_timestamp, _flags = RECORD_FIXED.unpack_from(frame, start)
        (count,) = BATCH_COUNT.unpack_from(frame, start + FIXED_SIZE)
        p = start + FIXED_SIZE + 4
        records: list[Record] = []
        append = records.append
        unpack_entry = ENTRY_HEAD.unpack_from
        unpack_u32 = _U32.unpack_from
        head_size = ENTRY_HEAD.size
        frame_size = len(frame)
        view = memoryview(frame)
        checked = b""  # the last names found valid (most batches have one exchange and key)
        least = 0  # the first entry is the base offset; each next one is above the last
        for _ in range(count):
            length, delta, timestamp_ms, flags = unpack_entry(frame, p)
            if delta < least or (least == 0 and delta != 0):
                raise RecordError("a record batch whose offsets do not increase from its base")
            least = delta + 1
            end = p + 4 + length
            if end > frame_size:
                raise RecordError("an entry past the end of the batch")
            names_at = p + head_size
            q = names_at + 1 + frame[names_at]
            q += 1 + frame[q]
            (n,) = unpack_u32(frame, q)
            properties_at = q + 4
            body_at = properties_at + n
            if body_at > end:
                raise RecordError("properties past the end of the record")
            names = frame[names_at:q]
            if names != checked:
                _check_names(names)
                checked = names
            append(
                Record(
                    base + delta,
                    timestamp_ms,
                    flags,
                    frame,
                    view,
                    names_at,
                    properties_at,
                    body_at,
                    end,
                    length + 4,
                )
            )
            p = end
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise RecordError(f"malformed record batch: {exc}") from None
    if not records or p != len(frame):
        raise RecordError("a record batch whose entries do not fill it")
    return Batch(base, max_timestamp, records, size)


def _decompressed(frame: bytes, start: int) -> bytes:
    """A compressed batch's fixed fields and count, then its entries decompressed."""
    head_end = start + FIXED_SIZE + BATCH_COUNT.size
    try:
        codec = frame[head_end]
        entries = compression.decompress(codec, frame[head_end + 1 :], MAX_RECORD)
    except (IndexError, compression.CompressionError) as exc:
        raise RecordError(f"a compressed batch that does not decompress: {exc}") from None
    return frame[start:head_end] + entries


def _parse(record: bytes, start: int, size: int) -> Record:
    """The record whose fixed fields start at ``record[start]`` (``size``: its whole length)."""
    try:
        offset, timestamp_ms, flags = RECORD_FIXED.unpack_from(record, start)
        names_at = start + FIXED_SIZE
        q = names_at + 1 + record[names_at]
        q += 1 + record[q]
        (n,) = _U32.unpack_from(record, q)
        properties_at = q + 4
        end = len(record)
        if properties_at + n > end:
            raise RecordError("properties past the end of the record")
        _check_names(record[names_at:q])
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise RecordError(f"malformed record: {exc}") from None
    return Record(
        offset,
        timestamp_ms,
        flags,
        record,
        memoryview(record),
        names_at,
        properties_at,
        properties_at + n,
        end,
        size,
    )


def _check_names(names: bytes) -> None:
    """The exchange and the routing key, two shortstrs, are UTF-8 (``UnicodeDecodeError``).
    With both length bytes ASCII (names under 128 bytes) one decode checks both: an ASCII byte
    is never inside a multi-byte sequence."""
    if names.isascii():  # ASCII is UTF-8
        return
    n = names[0]
    if n < 128 and names[1 + n] < 128:
        names.decode()
    else:
        names[1 : 1 + n].decode()
        names[2 + n :].decode()
