"""Kafka's Produce (API 0): each partition's record batches appended as produced.

A partition's ``records`` are whole record batches of magic 2. Each is checked as Kafka's
``LogValidator`` checks it before anything is written: its CRC (``CORRUPT_MESSAGE``), its
magic (``UNSUPPORTED_FOR_MESSAGE_FORMAT``), its codec (``UNSUPPORTED_COMPRESSION_TYPE`` for
one Kafka has not; compressed records are decompressed to be checked), its records' offset
deltas (0, 1, ... as the client numbers them) and count, each record's key and header names
(an AMQP routing key and header names: UTF-8 short strings, else ``INVALID_RECORD``) and
value (``max_message_size``: ``MESSAGE_TOO_LARGE``). Then the batches are appended as they
were produced (``StreamService.produce_kafka_batches``: one frame each, sent as stored to Kafka
consumers; an idempotent producer's batch only when its sequence follows, a repeat answered
with the offset it got: ``broker.streams.idempotence``), and the partition is answered once
they are durable (fsync'd, and in a cluster on
every in-sync replica), for ``acks`` 1 and -1 alike; ``acks=0`` is not answered, as Kafka
does not answer it. A refused batch writes nothing of its partition's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ...backends.kafka_batches import MAX_NAME_BYTES
from ...broker.streams.service import (
    DuplicateSequence,
    InvalidProducerEpoch,
    NotFound,
    OutOfOrderSequence,
    TopicError,
)
from ...protocol.kafka import compression, errors
from ...protocol.kafka.records import (
    COMPRESSION_MASK,
    BatchHeader,
    CorruptBatch,
    InvalidRecord,
    RecordTooLarge,
    UnsupportedCompression,
    UnsupportedMagic,
    check_batch,
    decode_batch,
    encode_batch,
    split_batches,
)
from ..topic_needs import produce as produce_needs
from .session import KafkaSession

log = logging.getLogger(__name__)


async def produce(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any] | None:
    responses = []
    acks_valid = body["acks"] in (-1, 0, 1)
    for topic in body["topic_data"]:
        name = topic["name"]
        allowed = await session.allowed(produce_needs(session.vhost, name))
        partitions = []
        for data in topic["partition_data"]:
            index = data["index"]
            if not acks_valid:  # Kafka's ReplicaManager: acks must be -1, 0 or 1
                code, offset = errors.INVALID_REQUIRED_ACKS, -1
            elif not allowed:
                code, offset = errors.TOPIC_AUTHORIZATION_FAILED, -1
            else:
                code, offset = await _produce_partition(session, name, index, data["records"])
            partitions.append(
                {
                    "index": index,
                    "error_code": code,
                    "base_offset": offset,
                    "log_append_time_ms": -1,
                }
            )
        responses.append({"name": name, "partition_responses": partitions})
    if body["acks"] == 0:
        return None  # Kafka sends no response to acks=0
    return {"responses": responses, "throttle_time_ms": 0}


async def _produce_partition(
    session: KafkaSession, topic: str, index: int, records: bytes | None
) -> tuple[int, int]:
    """The error code and base offset of one partition's part of a Produce."""
    try:
        arguments = session.service.arguments(topic)
        limit = _max_message_bytes(session, arguments)
        codec = _topic_codec(arguments)
        batches = [
            _recompressed(raw, check_batch(raw, max_value=limit, max_name=MAX_NAME_BYTES), codec)
            for raw in split_batches(records or b"")
        ]
    except NotFound:
        return errors.UNKNOWN_TOPIC_OR_PARTITION, -1
    except UnsupportedMagic:
        return errors.UNSUPPORTED_FOR_MESSAGE_FORMAT, -1
    except UnsupportedCompression:
        return errors.UNSUPPORTED_COMPRESSION_TYPE, -1
    except CorruptBatch:
        return errors.CORRUPT_MESSAGE, -1
    except RecordTooLarge:
        return errors.MESSAGE_TOO_LARGE, -1
    except InvalidRecord as exc:
        log.info("kafka produce to %s-%d refused: %s", topic, index, exc)
        return errors.INVALID_RECORD, -1
    if not batches:
        return errors.INVALID_RECORD, -1
    try:
        offset = await session.service.produce_kafka_batches(topic, index, batches)
    except NotFound:
        return errors.UNKNOWN_TOPIC_OR_PARTITION, -1
    except InvalidProducerEpoch:
        return errors.INVALID_PRODUCER_EPOCH, -1
    except OutOfOrderSequence as exc:
        log.info("kafka produce to %s-%d refused: %s", topic, index, exc)
        return errors.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
    except DuplicateSequence:
        return errors.DUPLICATE_SEQUENCE_NUMBER, -1
    except TopicError as exc:
        log.info("kafka produce to %s-%d refused: %s", topic, index, exc)
        return errors.KAFKA_STORAGE_ERROR, -1
    return errors.NONE, offset


def _max_message_bytes(session: KafkaSession, arguments: Mapping[str, Any]) -> int:
    """The largest record the topic takes: the broker's ``max_message_size``, or its
    ``max.message.bytes`` (``x-stream-max-message-bytes``) when less."""
    limit = session.broker.config.max_message_size
    own = arguments.get("x-stream-max-message-bytes")
    return min(limit, own) if isinstance(own, int) else limit


def _topic_codec(arguments: Mapping[str, Any]) -> int | None:
    """The codec the topic's ``compression.type`` (``x-stream-compression-type``) stores
    batches with; None for ``producer`` (the default): as produced."""
    name = arguments.get("x-stream-compression-type")
    if not isinstance(name, str) or name == "producer":
        return None
    return compression.NONE if name == "uncompressed" else compression.BY_NAME[name]


def _recompressed(raw: bytes, header: BatchHeader, codec: int | None) -> tuple[bytes, BatchHeader]:
    """The batch as the topic stores it: compressed with the topic's codec when it names
    another (Kafka's ``LogValidator`` recompresses so), else as produced."""
    if codec is None or header.compression == codec:
        return raw, header
    attributes = header.attributes & ~COMPRESSION_MASK | codec
    batch = decode_batch(raw)._replace(attributes=attributes)
    return encode_batch(batch), header._replace(attributes=attributes)
