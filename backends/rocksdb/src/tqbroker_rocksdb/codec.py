"""Keys and records of the RocksDB backend.

Key layout (one database, the default column family; every integer big-endian so that byte order
is numeric order and iteration is in id order):

- ``\\x00format``                  -> ``FORMAT_VERSION``
- ``\\x00next-queue-id``           -> u32: the next queue id (queue ids are never reused)
- ``\\x00clean``                   -> present only after a clean ``close`` (removed by ``open``)
- ``\\x00epoch``                   -> u64: the run counter, raised (and synced) by every ``open``;
  the messages pushed in run ``e`` get ids from ``e << 40`` up, so no id is ever handed out twice,
  whatever a crash lost
- ``r`` u16 len(vhost) vhost queue -> u32 queue id (the registry; names are UTF-8)
- ``q`` u32 qid ``d``              -> u64: delivery reservation: no id at or above it has been
  delivered; those below it may have been (they come back flagged redelivered)
- ``q`` u32 qid ``m`` u64 id       -> the record of a persistent message
- ``t`` u32 qid u64 id             -> the record of a transient message: written like the others
  (so that a queue's bodies stay on disk whatever their persistence) but never synced for their
  own sake, and dropped by ``open`` with one range delete of every ``t`` key

All of a queue's persistent keys share the prefix ``q`` u32 qid and its transient ones the prefix
``t`` u32 qid, so deleting a queue is two range deletes; its persistent messages are the
contiguous range ``[q qid m, q qid n)``, its transient ones ``[t qid, t qid+1)``.

Record: a 17-byte header ``>BQHHI`` (record version 2, the message's ``timestamp_ms``, the length
of the exchange name, of the routing key, of the raw properties), then the exchange and routing
key (UTF-8), the properties exactly as the publisher sent them, and the body (the rest of the
record). Hand-rolled rather than CBOR: the schema is five fixed fields, decoding is one
``unpack_from`` and slices, the body size is known from the header alone (``body_size``), and it
needs no dependency. Version 1 records (no timestamp) belong to database format 1, which this
version refuses to open.
"""

from __future__ import annotations

import struct

from tqbroker.backends import Message

FORMAT_VERSION = b"2"  # 2: records carry the message timestamp

META_FORMAT = b"\x00format"
META_NEXT_QUEUE_ID = b"\x00next-queue-id"
META_CLEAN = b"\x00clean"
META_EPOCH = b"\x00epoch"

EPOCH_SHIFT = 40  # ids per run and queue: 2**40; runs: 2**24
MAX_EPOCH = 2 ** (64 - EPOCH_SHIFT) - 1

REGISTRY = b"r"
QUEUE = b"q"
TRANSIENT = b"t"
TRANSIENT_END = b"u"  # the exclusive end of every transient key
_MESSAGES = b"m"
_RESERVATION = b"d"

MAX_QUEUE_ID = 2**32 - 2  # so that ``queue_end`` never overflows

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_RECORD_HEADER = struct.Struct(">BQHHI")
_RECORD_VERSION = 2


def pack_u32(value: int) -> bytes:
    return _U32.pack(value)


def unpack_u32(data: bytes) -> int:
    value: int = _U32.unpack(data)[0]
    return value


def pack_u64(value: int) -> bytes:
    return _U64.pack(value)


def unpack_u64(data: bytes) -> int:
    value: int = _U64.unpack(data)[0]
    return value


def registry_key(vhost: str, queue: str) -> bytes:
    encoded = vhost.encode()
    return REGISTRY + _U16.pack(len(encoded)) + encoded + queue.encode()


def parse_registry_key(key: bytes) -> tuple[str, str]:
    (length,) = _U16.unpack_from(key, len(REGISTRY))
    start = len(REGISTRY) + _U16.size
    return key[start : start + length].decode(), key[start + length :].decode()


def queue_prefix(qid: int) -> bytes:
    """The prefix of every key of queue ``qid``."""
    return QUEUE + _U32.pack(qid)


def queue_end(qid: int) -> bytes:
    """The exclusive end of queue ``qid``'s keys (for a range delete)."""
    return QUEUE + _U32.pack(qid + 1)


def messages_start(prefix: bytes) -> bytes:
    return prefix + _MESSAGES


def message_key(prefix: bytes, message_id: int) -> bytes:
    return prefix + _MESSAGES + _U64.pack(message_id)


def message_id_of(key: bytes) -> int:
    """The message id of a message key, persistent or transient (its last 8 bytes)."""
    return unpack_u64(key[-_U64.size :])


def queue_id_of(key: bytes) -> int:
    """The queue id of any key under ``queue_prefix`` or ``transient_prefix``."""
    return unpack_u32(key[len(QUEUE) : len(QUEUE) + _U32.size])


def transient_prefix(qid: int) -> bytes:
    """The prefix of every transient message key of queue ``qid``."""
    return TRANSIENT + _U32.pack(qid)


def transient_end(qid: int) -> bytes:
    """The exclusive end of queue ``qid``'s transient message keys."""
    return TRANSIENT + _U32.pack(qid + 1)


def transient_key(transient: bytes, message_id: int) -> bytes:
    """The key of a transient message, under ``transient_prefix``."""
    return transient + _U64.pack(message_id)


def is_transient_key(key: bytes) -> bool:
    return key[:1] == TRANSIENT


def reservation_key(prefix: bytes) -> bytes:
    return prefix + _RESERVATION


def encode_record(message: Message) -> bytes:
    exchange = message.exchange.encode()
    routing_key = message.routing_key.encode()
    properties = message.properties_raw
    header = _RECORD_HEADER.pack(
        _RECORD_VERSION, message.timestamp_ms, len(exchange), len(routing_key), len(properties)
    )
    return b"".join((header, exchange, routing_key, properties, message.body))


def _header(record: bytes) -> tuple[int, int, int, int]:
    """Timestamp and the three lengths of a record's header."""
    version, timestamp_ms, exchange_len, routing_key_len, properties_len = (
        _RECORD_HEADER.unpack_from(record)
    )
    if version != _RECORD_VERSION:
        raise ValueError(f"unknown message record version {version}")
    return timestamp_ms, exchange_len, routing_key_len, properties_len


def decode_record(record: bytes) -> Message:
    timestamp_ms, exchange_len, routing_key_len, properties_len = _header(record)
    start = _RECORD_HEADER.size
    exchange = record[start : start + exchange_len].decode()
    start += exchange_len
    routing_key = record[start : start + routing_key_len].decode()
    start += routing_key_len
    properties = record[start : start + properties_len]
    start += properties_len
    return Message(exchange, routing_key, properties, record[start:], timestamp_ms=timestamp_ms)


def body_size(record: bytes) -> int:
    """The length of the body of an encoded message, from its header alone."""
    _timestamp_ms, exchange_len, routing_key_len, properties_len = _header(record)
    return len(record) - _RECORD_HEADER.size - exchange_len - routing_key_len - properties_len
