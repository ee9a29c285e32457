"""The management API's queues: ``/api/queues[/{vhost}[/{name}]]`` (GET; PUT declares; DELETE
with ``if-empty``/``if-unused``), ``/contents`` (DELETE purges), ``/get`` (POST: fetch
messages, as RabbitMQ's "Get messages") and ``/bindings``; queues as RabbitMQ's JSON.

A stream queue also reports its log: ``first_offset``, ``committed_offset`` (the durable end)
and ``segments`` where its backend counts them.
"""

from __future__ import annotations

import base64
from typing import Any

import attrs
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...backends.base import FLUSH_FIRST
from ...broker.classic import ClassicQueue
from ...broker.declaring import open_and_declare_queue
from ...broker.pacing import Pacer
from ...broker.queue import Queue
from ...broker.stats import message_stats
from ...broker.streams.service import partition_of
from ...broker.vhost import VirtualHost
from ...protocol.errors import AMQPError
from ...protocol.methods import BasicProperties
from ...recordbatch import json_value
from .auth import broker_of
from .mgmt_access import access_refused, require, require_get
from .mgmt_bindings import binding_json, bindings_of_queue
from .mgmt_common import (
    api_user,
    api_vhost,
    bad_request,
    flag,
    integer,
    json_body,
    listed_vhosts,
    listing,
    not_found,
    query_flag,
    refusal,
    segment,
    short_string,
    table,
    topology_change,
)
from .mgmt_connections import connections_of, consumer_details

QUEUE_STATS: tuple[str, ...] = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack")
QUEUE_STATS += ("get_empty", "redeliver", "ack")
# The message properties, as RabbitMQ's API names them (AMQP's names).
PROPERTY_NAMES = tuple(field.name for field in attrs.fields(BasicProperties))
# The most messages one get may fetch (they are held, and answered, in one response).
MAX_GET_COUNT = 10_000
ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


def queue_json(queue: Queue, node: str) -> dict[str, Any]:
    """A queue as RabbitMQ's management API shows it (the fields tqbroker has)."""
    ready = queue.message_count
    unacked = queue.store.unacked_count if isinstance(queue, ClassicQueue) else 0
    exclusive_tag = next((c.tag for c in queue.consumers if c.exclusive), None)
    found: dict[str, Any] = {
        "name": queue.name,
        "vhost": queue.vhost,
        "type": queue.queue_type,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "arguments": json_value(dict(queue.arguments.table)),
        "node": node,
        "state": "crashed" if queue.failure is not None else "running",
        "consumers": len(queue.consumers),
        "exclusive_consumer_tag": exclusive_tag,
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "policy": None,
        "operator_policy": None,
        "effective_policy_definition": {},
        "storage_backend": queue.backend_name,
    }
    if isinstance(queue, ClassicQueue):
        found["message_bytes_ready"] = queue.store.ready_bytes
        found["message_bytes"] = queue.store.ready_bytes
    partition = partition_of(queue)
    if partition is not None:
        found["first_offset"] = partition.log_start_offset
        found["committed_offset"] = partition.high_watermark
        found["next_offset"] = partition.log_end_offset
        segments = partition.storage_info().segments
        if segments is not None:
            found["segments"] = segments
    if queue.failure is not None:
        found["failure"] = queue.failure
    stats = message_stats(queue.stats, QUEUE_STATS)
    if stats:
        found["message_stats"] = stats
    return found


async def list_queues(request: Request) -> Response:
    """``GET /api/queues`` and ``GET /api/queues/{vhost}``."""
    node = broker_of(request).node_name
    vhosts = await listed_vhosts(request)
    return await listing(
        request,
        (queue_json(q, node) for v in vhosts for q in list(v.queues.values()) if not q.deleted),
    )


def _queue(vhost: VirtualHost, request: Request) -> Queue:
    queue = vhost.queues.get(segment(request, "name"))
    if queue is None or queue.deleted:
        raise not_found()
    return queue


async def show_queue(request: Request) -> Response:
    """``GET /api/queues/{vhost}/{name}``."""
    vhost = await api_vhost(request)
    queue = _queue(vhost, request)
    node = broker_of(request).node_name
    found = queue_json(queue, node)
    found["consumer_details"] = consumer_details(connections_of(request), queue, node)
    found["deliveries"] = found["incoming"] = []
    return JSONResponse(found)


async def declare_queue(request: Request) -> Response:
    """``PUT /api/queues/{vhost}/{name}``: 201 created, 204 if it existed as asked."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    body = await json_body(request)
    name = short_string(segment(request, "name"), "the queue name")
    arguments = table(body.get("arguments"), "arguments")
    if name.startswith("amq."):
        raise access_refused()
    await require(request, user, vhost, ("queue", name, "configure"))
    durable, auto_delete = flag(body, "durable", True), flag(body, "auto_delete", False)
    existed = name in vhost.queues
    async with topology_change(vhost):
        await open_and_declare_queue(
            vhost,
            name,
            passive=False,
            durable=durable,
            exclusive=False,
            auto_delete=auto_delete,
            arguments=arguments,
            owner=None,
        )
    return Response(status_code=204 if existed else 201)


async def delete_queue(request: Request) -> Response:
    """``DELETE /api/queues/{vhost}/{name}`` (``?if-empty=true``, ``?if-unused=true``)."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    queue = _queue(vhost, request)
    await require(request, user, vhost, ("queue", queue.name, "configure"))
    async with topology_change(vhost):
        vhost.delete_queue(
            queue.name,
            if_unused=query_flag(request, "if-unused"),
            if_empty=query_flag(request, "if-empty"),
            owner=queue.exclusive_owner,
        )
    return Response(status_code=204)


async def purge_queue(request: Request) -> Response:
    """``DELETE /api/queues/{vhost}/{name}/contents``."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    queue = _queue(vhost, request)
    await require(request, user, vhost, ("queue", queue.name, "read"))
    try:
        vhost.purge_queue(queue.name, queue.exclusive_owner)
    except AMQPError as exc:
        raise refusal(exc) from None
    return Response(status_code=204)


async def queue_bindings(request: Request) -> Response:
    """``GET /api/queues/{vhost}/{name}/bindings``."""
    vhost = await api_vhost(request)
    queue = _queue(vhost, request)
    return await listing(request, (binding_json(b) for b in bindings_of_queue(vhost, queue)))


async def get_messages(request: Request) -> Response:
    """``POST /api/queues/{vhost}/{name}/get``: up to ``count`` messages, then, by ``ackmode``,
    requeued (as they were, marked redelivered), acked, or rejected (dead-lettered where the
    queue says so)."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    queue = _queue(vhost, request)
    await require_get(request, user, vhost, queue.name)
    body = await json_body(request)
    count = integer(body, "count", 1, 1, MAX_GET_COUNT)
    truncate = integer(body, "truncate", 2**63 - 1, 0, 2**63 - 1)
    ackmode, encoding = body.get("ackmode", "ack_requeue_true"), body.get("encoding", "auto")
    if ackmode not in ACK_MODES:
        raise bad_request(f"'ackmode' must be one of {', '.join(ACK_MODES)}, not {ackmode!r}")
    if encoding not in ("auto", "base64"):
        raise bad_request(f"'encoding' must be auto or base64, not {encoding!r}")
    if not isinstance(queue, ClassicQueue):
        raise bad_request(f"messages can only be fetched from classic queues, not '{queue.name}'")
    taken = await _take(queue, count)
    # Settled only once every message was taken; anything that stopped the taking (a
    # cancelled request, a deleted queue) requeued what was taken, losing nothing.
    for message_id, _message, _redelivered, _left in reversed(taken):
        if ackmode.endswith("requeue_true"):
            queue.requeue(message_id, None)
        elif ackmode.startswith("ack"):
            queue.ack(message_id, None)
        else:
            queue.reject(message_id, None)
    found = []
    for _id, message, redelivered, left in taken:
        payload = bytes(message.body)
        found.append(
            {
                "payload_bytes": len(payload),
                "redelivered": redelivered,
                "exchange": message.exchange,
                "routing_key": message.routing_key,
                "message_count": left,
                "properties": _properties(message),
                **_payload(payload[:truncate], encoding),
            }
        )
    return JSONResponse(found)


async def _take(queue: ClassicQueue, count: int) -> list[tuple[int, Any, bool, int]]:
    """Up to ``count`` messages from ``queue``: ``(id, message, redelivered, left)``, giving way
    to other clients as it goes; if it is interrupted, what it took goes back to the queue."""
    taken: list[tuple[int, Any, bool, int]] = []
    pacer = Pacer()
    try:
        while len(taken) < count and not queue.deleted:
            entry = queue.get()
            if entry is FLUSH_FIRST:
                assert queue.flusher is not None
                flushed = trio.Event()
                queue.flusher.call_after_flush(flushed.set)
                await flushed.wait()
                continue
            if entry is None:
                break
            taken.append((*entry, queue.message_count))
            await pacer.step()
    except BaseException:
        for message_id, *_rest in reversed(taken):
            if not queue.deleted:
                queue.requeue(message_id, None)
        raise
    return taken


def _payload(payload: bytes, encoding: str) -> dict[str, str]:
    if encoding == "auto":
        try:
            return {"payload": payload.decode("utf-8"), "payload_encoding": "string"}
        except UnicodeDecodeError:
            pass
    return {"payload": base64.b64encode(payload).decode(), "payload_encoding": "base64"}


def _properties(message: Any) -> dict[str, Any]:
    """A message's properties as RabbitMQ's API names them (the ones set)."""
    properties = message.properties
    found: dict[str, Any] = {}
    for field in PROPERTY_NAMES:
        value = getattr(properties, field, None)
        if value is not None:
            found[field] = json_value(value)
    return found
