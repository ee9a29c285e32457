"""The JSON routes that administer topics and consumer groups (``kafka-topics`` and
``kafka-consumer-groups`` over HTTP): list, describe, delete, grow partitions, alter Kafka topic
configs (``topic_config``); list and describe
groups, reset a group's offsets. Same credentials, ``vhost`` parameter and error shape as the
other topic routes (``topic_routes.py``); the work is the vhost's ``StreamService``'s.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...broker.streams import service
from ...broker.streams.service import StreamService
from ...broker.streams.topic_config import DELETE, SET
from ...broker.vhost import VirtualHost
from ...recordbatch import json_value
from ..registry import Registered
from . import inputs, topic_access
from .auth import broker_of, vhost_of
from .cluster_state import cluster_of, replication_json
from .errors import RequestError
from .mgmt_connections import connections_of


async def list_topics(request: Request) -> Response:
    """``GET /topics``: every topic of the vhost and its partition count."""
    vhost = await vhost_of(request)
    return JSONResponse(
        [
            {
                "topic": t.name,
                "partitions": t.partitions,
                "partitioned": t.partitioned,
                "vhost": vhost.name,
            }
            for t in StreamService(vhost).list_topics()
        ]
    )


async def describe_topic(request: Request) -> Response:
    """``GET /topics/{topic}``: its partitions' logs, its arguments and the groups reading it;
    in a cluster, each replicated partition's leader, epoch, replicas, ISR and state too
    (``cluster_state.replication_json``: Kafka's Leader, Replicas, Isr)."""
    vhost = await vhost_of(request)
    topic = request.path_params["topic"]
    found = StreamService(vhost).describe(topic)
    cluster = cluster_of(request)
    records = cluster.view.partitions if cluster is not None else {}
    partitions = []
    for p in found:
        described: dict[str, Any] = {
            "partition": p.partition,
            "queue": p.queue,
            "log_start_offset": p.log_start,
            "log_end_offset": p.log_end,
            "messages": p.messages,
            "segments": p.segments,
            "bytes": p.bytes,
        }
        replicated = records.get((vhost.name, p.queue))
        if replicated is not None:
            described.update(replication_json(replicated[0]))
        partitions.append(described)
    return JSONResponse(
        {
            "topic": topic,
            "vhost": vhost.name,
            "partitions": partitions,
            "arguments": json_value(StreamService(vhost).arguments(topic)),
            "configs": _configs_json(StreamService(vhost), request, topic),
            "groups": [g.group for g in StreamService(vhost).groups_of(topic)],
        }
    )


async def delete_topic(request: Request) -> Response:
    """``DELETE /topics/{topic}``: its partitions and its exchange (404 if unknown)."""
    vhost = await vhost_of(request)
    await topic_access.check_configure(request, vhost)
    topic = request.path_params["topic"]
    count = await StreamService(vhost).delete(topic)
    return JSONResponse({"topic": topic, "deleted_partitions": count})


async def alter_topic(request: Request) -> Response:
    """``PATCH /topics/{topic}`` ``{"partitions": N, "configs": {...}}``: grow to N partitions
    (never shrink), and set Kafka topic configs (null: back to the default), applied to every
    partition (``StreamService.alter_configs``); configs first, so a refused one grows
    nothing."""
    vhost = await vhost_of(request)
    body = await inputs.json_object(request)
    if "partitions" not in body and "configs" not in body:
        raise RequestError(
            400, 'give the new partition count or configs: {"partitions": N, "configs": {...}}'
        )
    topic = request.path_params["topic"]
    service = StreamService(vhost)
    answer: dict[str, Any] = {"topic": topic}
    if "configs" in body:
        configs = inputs.topic_configs(body["configs"])
        await topic_access.check_configure(request, vhost)
        changes = [
            (name, DELETE if value is None else SET, value) for name, value in configs.items()
        ]
        await service.alter_configs(topic, changes)
        answer["configs"] = _configs_json(service, request, topic)
    if "partitions" in body:
        count = inputs.integer(body["partitions"], "partitions")
        await topic_access.check_grow(request, vhost, count)
        answer["previous_partitions"] = await service.grow(topic, count)
    answer["partitions"] = len(service.partitions(topic))
    return JSONResponse(answer)


def _configs_json(service: StreamService, request: Request, topic: str) -> dict[str, str]:
    """The topic's Kafka configs, name to value (``GET /topics/{topic}``'s ``configs``)."""
    limit = broker_of(request).config.max_message_size
    return {c.name: c.value for c in service.configs(topic, max_message_bytes=limit)}


def _group_json(group: service.GroupSummary) -> dict[str, Any]:
    return {
        "group": group.group,
        "topic": group.topic,
        "members": group.members,
        "state": group.state,
    }


async def topic_groups(request: Request) -> Response:
    """``GET /topics/{topic}/groups``: the groups with offsets or members on the topic."""
    vhost = await vhost_of(request)
    return JSONResponse(
        [_group_json(g) for g in StreamService(vhost).groups_of(request.path_params["topic"])]
    )


async def all_groups(request: Request) -> Response:
    """``GET /groups``: every group on every topic of the vhost."""
    vhost = await vhost_of(request)
    return JSONResponse([_group_json(g) for g in StreamService(vhost).all_groups()])


async def describe_group(request: Request) -> Response:
    """``GET /topics/{topic}/groups/{group}``: per partition the committed offset, log end, lag
    and the member reading it; the group's state."""
    vhost = await vhost_of(request)
    topic = request.path_params["topic"]
    name = request.path_params["group"]
    streams = StreamService(vhost)
    found = streams.fetch_offsets(topic, name)
    where = {
        id(channel): entry
        for entry in connections_of(request)
        for channel in list(entry.connection.channels.values())
    }
    readers = {m.partition: where.get(id(m.channel)) for m in streams.group_members(topic, name)}
    return JSONResponse(
        {
            "topic": topic,
            "group": name,
            "state": streams.group_state(topic, name),
            "partitions": [
                {
                    "partition": p.partition,
                    "committed": p.committed,
                    "latest": p.latest,
                    "lag": p.lag,
                    "reader": p.reader,
                    "connection": _name(readers.get(p.partition)),
                    "host": _host(readers.get(p.partition)),
                }
                for p in found
            ],
            "lag": sum(p.lag or 0 for p in found),
        }
    )


async def reset_offsets(request: Request) -> Response:
    """``POST /topics/{topic}/groups/{group}/offsets`` ``{"to": "earliest"|"latest"|"offset"|
    "datetime", "value": ..., "dry_run": bool, "partitions": [...]}``: the new offsets (written
    unless ``dry_run``); 409 while the group has members."""
    vhost = await vhost_of(request)
    await topic_access.check_read(request, vhost)
    body = await inputs.json_object(request)
    to = body.get("to")
    if not isinstance(to, str):
        raise RequestError(400, f"'to' must be one of {', '.join(service.RESET_TARGETS)}")
    value: int | None = None
    if to == "offset" and "value" in body:
        value = inputs.integer(body["value"], "value")
    elif to == "datetime" and "value" in body:
        raw = body["value"]
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = inputs.integer(raw, "value")
        else:
            value = inputs.timestamp(str(raw))
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise RequestError(400, f"'dry_run' must be true or false (got {dry_run!r})")
    only = body.get("partitions")
    if only is not None:
        if not isinstance(only, list):
            raise RequestError(400, "'partitions' must be a list of partition numbers")
        only = [inputs.integer(n, "partitions") for n in only]
    topic = request.path_params["topic"]
    name = request.path_params["group"]
    targets = StreamService(vhost).reset_targets(topic, name, to, value, only=only)
    before = {p.partition: p.committed for p in _positions(vhost, topic, name)}
    if not dry_run:
        await StreamService(vhost).commit_offsets(topic, name, targets)
    return JSONResponse(
        {
            "topic": topic,
            "group": name,
            "dry_run": dry_run,
            "partitions": [
                {"partition": n, "previous": before.get(n), "offset": offset}
                for n, offset in targets
            ],
        }
    )


def _name(entry: Registered | None) -> str | None:
    return entry.name if entry is not None else None


def _host(entry: Registered | None) -> str | None:
    return entry.peer_host if entry is not None else None


def _positions(vhost: VirtualHost, topic: str, name: str) -> list[service.GroupPartition]:
    try:
        return StreamService(vhost).fetch_offsets(topic, name)
    except service.NotFound:  # a group new to the topic: the reset creates its offsets
        return []


TOPIC_ADMIN_ROUTES = [
    Route("/topics", list_topics),
    Route("/groups", all_groups),
    Route("/topics/{topic}", describe_topic, methods=["GET"]),
    Route("/topics/{topic}", delete_topic, methods=["DELETE"]),
    Route("/topics/{topic}", alter_topic, methods=["PATCH"]),
    Route("/topics/{topic}/groups", topic_groups),
    Route("/topics/{topic}/groups/{group}", describe_group),
    Route("/topics/{topic}/groups/{group}/offsets", reset_offsets, methods=["POST"]),
]
