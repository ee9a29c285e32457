"""What the Kafka listener answers, API by API, over the stream service (``StreamService``):
a thin layer of Kafka's names over the broker's streams.

A Kafka topic is a stream topic (a partitioned stream, or one stream queue) of the session's
vhost. Served so far:
- ApiVersions: the APIs and versions in ``SERVED``;
- Metadata: this node as the only broker (the address the client connected to), every topic
  (or those asked for: an unknown one is ``UNKNOWN_TOPIC_OR_PARTITION``), each partition led
  here, leader epoch -1 (not exposed: clients then skip KIP-320's validation);
- Produce: each partition's record batches (magic 2, CRC-checked, uncompressed) appended in
  order, the producer's timestamps, keys and headers kept; answered once durable (``acks``
  1 and -1 alike; 0 is not answered, as Kafka does not);
- Fetch: from each partition's offset, up to the high watermark, at most
  ``partition_max_bytes`` and ``max_bytes``, as one record batch per partition; waits up to
  ``max_wait_ms`` when nothing is there;
- ListOffsets: earliest (-2), latest (-1: the high watermark), or the first at or after a
  timestamp;
- InitProducerId: a producer id (idempotent producers' sequences are not deduplicated yet).
- FindCoordinator, OffsetCommit and OffsetFetch are ``group_offsets.py``'s; JoinGroup,
  SyncGroup, Heartbeat and LeaveGroup ``groups.py``'s.

Permissions are RabbitMQ's, on what an AMQP client would touch (``topic_needs``): ``write``
to produce, ``read`` to fetch and list offsets; a refusal is
``TOPIC_AUTHORIZATION_FAILED``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from ...broker.streams.service import (
    ConsumerRecord,
    NotFound,
    ProducerRecord,
    StreamService,
    TopicError,
)
from ...protocol.kafka import errors
from ...protocol.kafka.records import (
    CorruptBatch,
    Header,
    RecordBatch,
    UnsupportedCompression,
    UnsupportedMagic,
    batch_of,
    decode_batches,
    encode_batch,
)
from ..topic_needs import produce as produce_needs
from ..topic_needs import read as read_needs
from .session import KafkaSession

log = logging.getLogger(__name__)

NODE_ID = 0
# API key -> (min, max) served (shared/reference/kafka.md §0: the "lean caps", at which all four
# clients land on one version; Produce from 0, as librdkafka before 2.11.1 needs to compress).
SERVED: Mapping[int, tuple[int, int]] = {
    0: (0, 7),  # Produce
    1: (4, 10),  # Fetch
    2: (0, 3),  # ListOffsets
    3: (0, 5),  # Metadata
    8: (0, 3),  # OffsetCommit
    9: (1, 3),  # OffsetFetch
    10: (0, 2),  # FindCoordinator
    11: (0, 5),  # JoinGroup
    12: (0, 3),  # Heartbeat
    13: (0, 1),  # LeaveGroup
    14: (0, 3),  # SyncGroup
    17: (1, 1),  # SaslHandshake (version 0's unframed tokens are not served)
    18: (0, 3),  # ApiVersions
    22: (0, 0),  # InitProducerId
    36: (0, 1),  # SaslAuthenticate
}
LATEST, EARLIEST = -1, -2
MAX_NAME_BYTES = 255  # a routing key's and a header name's (AMQP short strings)


def api_versions(error_code: int = errors.NONE) -> dict[str, Any]:
    """The served ranges (``error_code``: at a version not served, in a version 0 body)."""
    keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in SERVED.items()]
    return {"error_code": error_code, "api_keys": keys, "throttle_time_ms": 0}


async def metadata(session: KafkaSession, body: Mapping[str, Any], version: int) -> dict[str, Any]:
    service = session.service
    asked = body.get("topics")
    if asked is None or (version == 0 and not asked):
        names = [summary.name for summary in service.list_topics()]
    else:
        names = [topic["name"] for topic in asked]
    topics = []
    for name in names:
        try:
            count = len(service.partitions(name))
        except TopicError:
            topics.append({"error_code": errors.UNKNOWN_TOPIC_OR_PARTITION, "name": name})
            continue
        partitions = [
            {
                "partition_index": n,
                "leader_id": NODE_ID,
                "leader_epoch": -1,
                "replica_nodes": [NODE_ID],
                "isr_nodes": [NODE_ID],
            }
            for n in range(count)
        ]
        topics.append({"error_code": errors.NONE, "name": name, "partitions": partitions})
    host, port = session.local_address
    return {
        "brokers": [{"node_id": NODE_ID, "host": host, "port": port, "rack": None}],
        "cluster_id": "tqbroker",
        "controller_id": NODE_ID,
        "topics": topics,
    }


async def init_producer_id(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    return {"error_code": errors.NONE, "producer_id": secrets.randbits(62), "producer_epoch": 0}


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
        batches = decode_batches(records or b"")
    except UnsupportedMagic:
        return errors.UNSUPPORTED_FOR_MESSAGE_FORMAT, -1
    except UnsupportedCompression:
        return errors.UNSUPPORTED_COMPRESSION_TYPE, -1
    except CorruptBatch:
        return errors.CORRUPT_MESSAGE, -1
    try:
        produced = [record for batch in batches for record in _producer_records(batch, index)]
    except ValueError as exc:
        log.info("kafka produce to %s-%d refused: %s", topic, index, exc)
        return errors.INVALID_RECORD, -1
    if not produced:
        return errors.INVALID_RECORD, -1
    limit = session.broker.config.max_message_size
    if any(len(record.value) > limit for record in produced):
        return errors.MESSAGE_TOO_LARGE, -1
    try:
        landed = await session.service.produce(topic, produced)
    except NotFound:
        return errors.UNKNOWN_TOPIC_OR_PARTITION, -1
    except TopicError as exc:
        log.info("kafka produce to %s-%d refused: %s", topic, index, exc)
        return errors.KAFKA_STORAGE_ERROR, -1
    return errors.NONE, landed[0][1] if landed else -1


def _producer_records(batch: RecordBatch, index: int) -> list[ProducerRecord]:
    """The batch's records as the stream takes them (``ValueError``: a key that is not UTF-8
    or is over 255 bytes, a header name over 255 bytes: an AMQP routing key and header names
    are short strings)."""
    made = []
    for record in batch.records:
        key = record.key or b""
        if len(key) > MAX_NAME_BYTES:
            raise ValueError(f"a key of {len(key)} bytes (at most {MAX_NAME_BYTES})")
        for header in record.headers:
            if len(header.key.encode()) > MAX_NAME_BYTES:
                raise ValueError(f"a header name over {MAX_NAME_BYTES} bytes")
        made.append(
            ProducerRecord(
                value=record.value or b"",
                key=key.decode(),  # UnicodeDecodeError is a ValueError
                headers={h.key: h.value for h in record.headers},
                partition=index,
                timestamp_ms=batch.base_timestamp + record.timestamp_delta,
            )
        )
    return made


async def fetch(session: KafkaSession, body: Mapping[str, Any], version: int) -> dict[str, Any]:
    budget = body.get("max_bytes", 0x7FFFFFFF)
    asked = [
        (topic["topic"], p["partition"], p["fetch_offset"], p["partition_max_bytes"])
        for topic in body["topics"]
        for p in topic["partitions"]
    ]
    answers = await _fetch_all(session, asked, budget)
    if not any(records for _code, _hw, _start, records in answers.values()):
        wait = body.get("max_wait_ms", 0) / 1000
        if wait > 0 and await _wait_for_records(session, asked, trio.current_time() + wait):
            answers = await _fetch_all(session, asked, budget)
    topics: dict[str, list[dict[str, Any]]] = {}
    for topic, index, _offset, _limit in asked:
        code, high_watermark, log_start, records = answers[(topic, index)]
        topics.setdefault(topic, []).append(
            {
                "partition_index": index,
                "error_code": code,
                "high_watermark": high_watermark,
                "last_stable_offset": high_watermark,
                "log_start_offset": log_start,
                "aborted_transactions": [],
                "preferred_read_replica": -1,
                "records": records,
            }
        )
    return {
        "throttle_time_ms": 0,
        "error_code": errors.NONE,
        "session_id": 0,
        "responses": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
    }


async def _fetch_all(
    session: KafkaSession, asked: Sequence[tuple[str, int, int, int]], budget: int
) -> dict[tuple[str, int], tuple[int, int, int, bytes]]:
    answers = {}
    allowed: dict[str, bool] = {}
    for topic, index, offset, limit in asked:
        if topic not in allowed:
            allowed[topic] = await session.allowed(read_needs(session.vhost, topic))
        answers[(topic, index)] = _fetch_one(session, topic, index, offset, min(limit, budget))
        if not allowed[topic]:
            answers[(topic, index)] = (errors.TOPIC_AUTHORIZATION_FAILED, -1, -1, b"")
        budget -= len(answers[(topic, index)][3])
    return answers


def _fetch_one(
    session: KafkaSession, topic: str, index: int, offset: int, limit: int
) -> tuple[int, int, int, bytes]:
    """(error code, high watermark, log start, the records as one batch) of a partition."""
    service = session.service
    try:
        partition = service.partition(topic, index)
    except TopicError:
        return errors.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, b""
    high_watermark, log_start = partition.high_watermark, partition.log_start_offset
    if offset < log_start or offset > high_watermark:
        return errors.OFFSET_OUT_OF_RANGE, high_watermark, log_start, b""
    if offset == high_watermark or limit <= 0:
        return errors.NONE, high_watermark, log_start, b""
    try:
        found = service.read(topic, index, offset=offset, limit=10_000, max_bytes=max(limit, 1))
    except TopicError:
        return errors.KAFKA_STORAGE_ERROR, high_watermark, log_start, b""
    return errors.NONE, high_watermark, log_start, _as_batch(found)


def _as_batch(found: Sequence[ConsumerRecord]) -> bytes:
    if not found:
        return b""
    records = [
        (_key(record.key), record.value, _headers(record.headers), record.timestamp_ms)
        for record in found
    ]
    batch = batch_of(records, found[0].offset)
    deltas = tuple(  # compaction may have left gaps between the offsets
        record._replace(offset_delta=at.offset - found[0].offset)
        for record, at in zip(batch.records, found, strict=True)
    )
    return encode_batch(batch._replace(records=deltas))


def _key(key: str) -> bytes | None:
    return key.encode() if key else None


def _headers(table: Mapping[str, Any]) -> list[Header]:
    made = []
    for name, value in table.items():
        if value is None or isinstance(value, bytes):
            made.append(Header(name, value))
        elif isinstance(value, str):
            made.append(Header(name, value.encode()))
        else:
            made.append(Header(name, str(value).encode()))
    return made


async def _wait_for_records(
    session: KafkaSession, asked: Sequence[tuple[str, int, int, int]], deadline: float
) -> bool:
    """Wait until one of the partitions has records past its fetch offset, or ``deadline``."""
    service = session.service
    waiting = []
    for topic, index, offset, _limit in asked:
        try:
            waiting.append((service.partition(topic, index), offset))
        except TopicError:
            continue
    if not waiting:
        return False
    grown = False
    async with trio.open_nursery() as nursery:

        async def wait(partition: Any, offset: int) -> None:
            nonlocal grown
            if await partition.wait_beyond(offset, deadline):
                grown = True
                nursery.cancel_scope.cancel()

        for partition, offset in waiting:
            nursery.start_soon(wait, partition, offset)
    return grown


async def list_offsets(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    service = session.service
    topics = []
    for topic in body["topics"]:
        name = topic["name"]
        allowed = await session.allowed(read_needs(session.vhost, name))
        partitions = []
        for asked in topic["partitions"]:
            index, timestamp = asked["partition_index"], asked["timestamp"]
            answer = {"partition_index": index, "timestamp": -1, "offset": -1}
            if not allowed:
                answer["error_code"] = errors.TOPIC_AUTHORIZATION_FAILED
            else:
                answer.update(_offset(service, name, index, timestamp))
            if version == 0:
                answer["old_style_offsets"] = [answer["offset"]] if answer["offset"] >= 0 else []
            partitions.append(answer)
        topics.append({"name": name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}


def _offset(service: StreamService, topic: str, index: int, timestamp: int) -> dict[str, int]:
    try:
        partition = service.partition(topic, index)
    except TopicError:
        return {"error_code": errors.UNKNOWN_TOPIC_OR_PARTITION}
    if timestamp == LATEST:
        return {"error_code": errors.NONE, "offset": partition.high_watermark}
    if timestamp == EARLIEST:
        return {"error_code": errors.NONE, "offset": partition.log_start_offset}
    offset = partition.offset_for_timestamp(timestamp)
    if offset >= partition.high_watermark:
        return {"error_code": errors.NONE, "offset": -1, "timestamp": -1}
    found = service.read(topic, index, offset=offset, limit=1)
    stamp = found[0].timestamp_ms if found else timestamp
    return {"error_code": errors.NONE, "offset": offset, "timestamp": stamp}
