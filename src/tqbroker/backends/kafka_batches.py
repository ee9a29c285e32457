"""Kafka record batches as a stream stores them, and the messages they hold.

A Kafka producer's batch (record batch v2, maybe compressed) is stored as it was produced, one
frame for all its records (``docs/storage-format.md``, format 3), so that a Kafka consumer is
sent the stored bytes. Every other reader (AMQP consumers, the HTTP topic API, compaction)
gets each record as the message a Kafka produce makes of it: the routing key the record's key
(UTF-8, at most 255 bytes), the
body its value, its headers the ``headers`` table (each value a byte string), persistent, its
timestamp the record's. A produce checks, before anything is stored, that each key and header
name can be (``records.check_batch`` with ``MAX_NAME_BYTES``).

Responsibilities:
- ``with_base_offset``: the batch's bytes at the offset the log gives it (Kafka's CRC does not
  cover the base offset, so nothing else changes);
- ``record_messages``: each record's offset delta and message;
- ``messages_of``: the messages alone, for a backend that stores messages one by one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from ..model import Message
from ..protocol.kafka.records import Record, RecordBatch
from ..protocol.methods import BasicProperties

MAX_NAME_BYTES = 255  # a routing key's and a header name's (AMQP short strings)
_PERSISTENT = BasicProperties(delivery_mode=2)
_PERSISTENT_RAW = _PERSISTENT.encode()
_BASE_OFFSET = struct.Struct(">q")


def with_base_offset(batch: bytes, offset: int) -> bytes:
    return _BASE_OFFSET.pack(offset) + batch[_BASE_OFFSET.size :]


def record_messages(exchange: str, batch: RecordBatch) -> Iterator[tuple[int, Message]]:
    """Each record's offset delta and the message it is."""
    base_timestamp = batch.base_timestamp
    for record in batch.records:
        key = (record.key or b"").decode()
        properties, raw = _properties(record) if record.headers else (_PERSISTENT, _PERSISTENT_RAW)
        timestamp_ms = base_timestamp + record.timestamp_delta
        message = Message(exchange, key, raw, record.value or b"", properties, timestamp_ms)
        yield record.offset_delta, message


def messages_of(exchange: str, batch: RecordBatch) -> list[Message]:
    return [message for _delta, message in record_messages(exchange, batch)]


def _properties(record: Record) -> tuple[BasicProperties, bytes]:
    properties = BasicProperties(headers={h.key: h.value for h in record.headers}, delivery_mode=2)
    try:
        return properties, properties.encode()
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"headers that do not encode: {exc}") from None
