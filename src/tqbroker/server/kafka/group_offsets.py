"""A Kafka consumer group's coordinator and committed offsets: FindCoordinator (this node,
for every group), OffsetCommit and OffsetFetch over the stream group of the same name (what
``x-stream-group`` consumers and ``tqbroker-ctl groups`` see). A commit needs ``read`` on the
partition's stream queue, as consuming it does, and a member of the group's current
generation (``GroupCoordinator.check_commit``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...broker.streams.service import NotFound, TopicError
from ...protocol.kafka import errors
from ..topic_needs import read as read_needs
from .session import KafkaSession


async def find_coordinator(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    """The group's coordinator (``KafkaNodes.coordinator``: this node, on one node)."""
    found = session.nodes.coordinator(body["key"], session.advertised_address)
    return {
        "throttle_time_ms": 0,
        "error_code": errors.NONE,
        "error_message": None,
        "node_id": found.node_id,
        "host": found.host,
        "port": found.port,
    }


async def offset_commit(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    group = body["group_id"]
    refusal = session.groups.check_commit(
        group, body["generation_id_or_member_epoch"], body["member_id"]
    )
    if not session.nodes.coordinates(group, session.advertised_address):
        refusal = errors.NOT_COORDINATOR  # the group's members are another node's
    topics = []
    for topic in body["topics"]:
        name = topic["name"]
        asked = [(p["partition_index"], p["committed_offset"]) for p in topic["partitions"]]
        code = refusal
        if code == errors.NONE and not await session.allowed(read_needs(session.vhost, name)):
            code = errors.TOPIC_AUTHORIZATION_FAILED
        if code == errors.NONE:
            code = await _commit(session, name, group, asked)
        partitions = [{"partition_index": index, "error_code": code} for index, _offset in asked]
        topics.append({"name": name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}


async def _commit(
    session: KafkaSession, topic: str, group: str, asked: list[tuple[int, int]]
) -> int:
    try:
        count = len(session.service.partitions(topic))
        if any(not 0 <= index < count for index, _offset in asked):
            return errors.UNKNOWN_TOPIC_OR_PARTITION
        await session.service.commit_offsets(topic, group, asked)
    except NotFound:
        return errors.UNKNOWN_TOPIC_OR_PARTITION
    except TopicError:
        return errors.KAFKA_STORAGE_ERROR
    return errors.NONE


async def offset_fetch(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    group = body["group_id"]
    service = session.service
    asked = body.get("topics")
    if asked is None:  # every topic the group committed in (v2+)
        asked = [
            {"name": t.name, "partition_indexes": list(range(t.partitions))}
            for t in service.list_topics()
        ]
    topics = []
    for topic in asked:
        name = topic["name"]
        allowed = await session.allowed(read_needs(session.vhost, name))
        partitions = []
        for index in topic["partition_indexes"]:
            answer = {
                "partition_index": index,
                "committed_offset": -1,
                "metadata": "",
                "error_code": errors.NONE,
            }
            if not allowed:
                answer["error_code"] = errors.TOPIC_AUTHORIZATION_FAILED
            else:
                try:
                    committed = service.partition(name, index).group_offsets.get(group)
                except TopicError:
                    answer["error_code"] = errors.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    answer["committed_offset"] = -1 if committed is None else committed
            partitions.append(answer)
        if body.get("topics") is None and all(p["committed_offset"] < 0 for p in partitions):
            continue
        topics.append({"name": name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics, "error_code": errors.NONE}
