"""Kafka's Fetch (API 1): each partition's records from the fetch offset, as record batches.

Up to the high watermark, at most ``partition_max_bytes`` per partition and ``max_bytes`` in
all (the first batch sent whole, then a trailing partial batch as Kafka sends it:
``StreamService.kafka_batches``); a Kafka producer's batches are sent as they are stored. When
no partition has records the fetch waits up to ``max_wait_ms`` for one to get some (the long
poll: ``Partition.wait_beyond``). An offset below the log start or past the high watermark is
``OFFSET_OUT_OF_RANGE``; ``read`` permission on the partition's stream queue is needed
(``TOPIC_AUTHORIZATION_FAILED``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trio

from ...broker.streams.service import TopicError
from ...protocol.kafka import errors
from ..topic_needs import read as read_needs
from .session import KafkaSession


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
    whole_first = True
    for topic, index, offset, limit in asked:
        if topic not in allowed:
            allowed[topic] = await session.allowed(read_needs(session.vhost, topic))
        if not allowed[topic]:
            answers[(topic, index)] = (errors.TOPIC_AUTHORIZATION_FAILED, -1, -1, b"")
            continue
        answer = _fetch_one(session, topic, index, offset, min(limit, budget), whole_first)
        answers[(topic, index)] = answer
        budget -= len(answer[3])
        whole_first = whole_first and not answer[3]
    return answers


def _fetch_one(
    session: KafkaSession, topic: str, index: int, offset: int, limit: int, whole_first: bool
) -> tuple[int, int, int, bytes]:
    """(error code, high watermark, log start, the record batches) of a partition; the first
    batch whole even over ``limit`` with ``whole_first`` (the first partition with records of
    a response, as Kafka's ``minOneMessage``)."""
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
        records = service.kafka_batches(topic, index, offset, limit, whole_first=whole_first)
    except TopicError:
        return errors.KAFKA_STORAGE_ERROR, high_watermark, log_start, b""
    return errors.NONE, high_watermark, log_start, records


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
