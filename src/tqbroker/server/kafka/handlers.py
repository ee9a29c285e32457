"""What the Kafka listener answers, API by API, over the stream service (``StreamService``):
a thin layer of Kafka's names over the broker's streams.

A Kafka topic is a stream topic (a partitioned stream, or one stream queue) of the session's
vhost. Served so far:
- ApiVersions: the APIs and versions in ``SERVED``;
- Metadata: this node as the only broker (the address the client connected to), every topic
  (or those asked for: an unknown one is ``UNKNOWN_TOPIC_OR_PARTITION``), each partition led
  here, leader epoch -1 (not exposed: clients then skip KIP-320's validation);
- Produce and Fetch are ``produce.py``'s and ``fetch.py``'s;
- ListOffsets: earliest (-2), latest (-1: the high watermark), or the first at or after a
  timestamp;
- InitProducerId: a producer id (idempotent producers' sequences are not deduplicated yet).
- FindCoordinator, OffsetCommit and OffsetFetch are ``group_offsets.py``'s; JoinGroup,
  SyncGroup, Heartbeat and LeaveGroup ``groups.py``'s; DescribeGroups and ListGroups
  ``group_listing.py``'s; CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs and
  IncrementalAlterConfigs ``admin.py``'s.

Permissions are RabbitMQ's, on what an AMQP client would touch (``topic_needs``): ``write``
to produce, ``read`` to fetch and list offsets; a refusal is
``TOPIC_AUTHORIZATION_FAILED``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any

from ...broker.streams.service import (
    StreamService,
    TopicError,
)
from ...protocol.kafka import errors
from ..topic_needs import read as read_needs
from .nodes import Placement
from .session import KafkaSession

log = logging.getLogger(__name__)

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
    15: (0, 3),  # DescribeGroups
    16: (0, 2),  # ListGroups
    17: (0, 1),  # SaslHandshake (after version 0, the tokens are bare frames: sasl.py)
    18: (0, 3),  # ApiVersions
    19: (0, 3),  # CreateTopics
    20: (0, 3),  # DeleteTopics
    22: (0, 0),  # InitProducerId
    32: (0, 1),  # DescribeConfigs
    36: (0, 1),  # SaslAuthenticate
    37: (0, 1),  # CreatePartitions
    44: (0, 1),  # IncrementalAlterConfigs (aiokafka has none; 1 is flexible)
}
LATEST, EARLIEST = -1, -2


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
    nodes = session.nodes
    brokers = nodes.brokers(session.advertised_address)
    live = [broker.node_id for broker in brokers]
    topics = []
    for name in names:
        try:
            queues = service.queue_names(name)
        except TopicError:
            topics.append({"error_code": errors.UNKNOWN_TOPIC_OR_PARTITION, "name": name})
            continue
        partitions = []
        for n, queue in enumerate(queues):
            placement = nodes.placement(session.vhost.name, queue, live)
            if placement is None:  # this node's alone
                here = nodes.this_node_id
                placement = Placement(here, [here], [here])
            leader = placement.leader
            partitions.append(
                {
                    "error_code": errors.NONE
                    if leader is not None
                    else errors.LEADER_NOT_AVAILABLE,
                    "partition_index": n,
                    "leader_id": -1 if leader is None else leader,
                    "leader_epoch": -1,
                    "replica_nodes": placement.replicas,
                    "isr_nodes": placement.isr,
                    "offline_replicas": [r for r in placement.replicas if r not in live],
                }
            )
        topics.append({"error_code": errors.NONE, "name": name, "partitions": partitions})
    return {
        "brokers": [
            {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": None} for b in brokers
        ],
        "cluster_id": "tqbroker",
        "controller_id": nodes.this_node_id,
        "topics": topics,
    }


async def init_producer_id(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    return {"error_code": errors.NONE, "producer_id": secrets.randbits(62), "producer_epoch": 0}


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
