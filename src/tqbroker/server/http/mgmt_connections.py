"""The management API's view of clients: ``/api/connections[/{name}]`` (DELETE, by an
administrator or the connection's own user, closes one with 320 ``CONNECTION_FORCED`` and the
``X-Reason`` header's text), ``/api/connections/{name}/channels``,
``/api/vhosts/{vhost}/connections``, ``/api/channels[/{name}]``, ``/api/consumers[/{vhost}]``;
each as RabbitMQ's JSON.
"""

from __future__ import annotations

from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...broker.consumer import Consumer
from ...broker.queue import Queue
from ...broker.stats import io_stats, message_stats
from ...recordbatch import json_value
from ..certinfo import connection_fields
from ..channel import Channel
from ..connection import AMQPConnection
from ..registry import Connections, Registered
from .auth import ApiUser, broker_of
from .errors import ApiError
from .mgmt_common import api_user, listed_vhosts, listing, not_found, segment

CHANNEL_STATS: tuple[str, ...] = ("publish", "confirm", "return_unroutable", "drop_unroutable")
CHANNEL_STATS += ("deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver", "ack")
DEFAULT_CLOSE_REASON = "Closed via management plugin"


def connections_of(request: Request) -> Connections:
    connections = request.app.state.connections
    assert isinstance(connections, Connections)
    return connections


def _user(connection: AMQPConnection) -> str:
    user = connection.handshake.user
    return user.name if user is not None else ""


def _vhost(connection: AMQPConnection) -> str:
    return connection.vhost.name if connection.vhost is not None else ""


def connection_json(entry: Registered, node: str) -> dict[str, Any]:
    connection = entry.connection
    protocol = connection.protocol
    properties = connection.handshake.client_properties
    found: dict[str, Any] = {
        "name": entry.name,
        "node": node,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "state": _state(connection),
        "user": _user(connection),
        "vhost": _vhost(connection),
        "host": entry.host,
        "port": entry.port,
        "peer_host": entry.peer_host,
        "peer_port": entry.peer_port,
        **_tls(connection),
        "auth_mechanism": connection.handshake.mechanism,
        "channel_max": protocol.channel_max,
        "frame_max": protocol.frame_max,
        "timeout": protocol.heartbeat,
        "channels": len(connection.channels),
        "connected_at": entry.connected_at_ms,
        "client_properties": json_value(dict(properties)),
        "user_provided_name": properties.get("connection_name"),
    }
    found.update(io_stats(connection.stats))
    return found


def _tls(connection: AMQPConnection) -> dict[str, Any]:
    """RabbitMQ's ``ssl``, ``ssl_protocol``, ``ssl_cipher``, ``peer_cert_*`` fields."""
    stream = connection.stream
    if not isinstance(stream, trio.SSLStream):
        return connection_fields(None, None, None)
    return connection_fields(stream.version(), stream.cipher(), stream.getpeercert())


def _state(connection: AMQPConnection) -> str:
    """RabbitMQ's connection states under alarms: ``blocked`` once it published and is not read
    from, ``blocking`` while an alarm is in effect and it has not published since."""
    if connection.flow.blocked:
        return "blocked"
    return "blocking" if connection.broker.alarms.active else "running"


def channel_name(entry: Registered, channel: Channel) -> str:
    return f"{entry.name} ({channel.number})"


def channel_json(entry: Registered, channel: Channel, node: str) -> dict[str, Any]:
    connection = entry.connection
    found: dict[str, Any] = {
        "name": channel_name(entry, channel),
        "number": channel.number,
        "node": node,
        "state": "running",
        "user": _user(connection),
        "vhost": channel.vhost.name,
        "connection_details": {
            "name": entry.name,
            "peer_host": entry.peer_host,
            "peer_port": entry.peer_port,
        },
        "consumer_count": len(channel.consumers),
        "prefetch_count": channel.prefetch_count,
        "global_prefetch_count": channel.global_prefetch,
        "confirm": channel.confirms is not None,
        "transactional": channel.tx is not None,
        "messages_unacknowledged": len(channel.deliveries),
    }
    shown = message_stats(channel.stats, CHANNEL_STATS)
    if shown:
        found["message_stats"] = shown
    return found


def channel_details(entry: Registered, channel: Channel, node: str) -> dict[str, Any]:
    return {
        "connection_name": entry.name,
        "name": channel_name(entry, channel),
        "node": node,
        "number": channel.number,
        "peer_host": entry.peer_host,
        "peer_port": entry.peer_port,
        "user": _user(entry.connection),
    }


def consumer_json(
    consumer: Consumer, queue: Queue, details: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue.name, "vhost": queue.vhost},
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch_count,
        "arguments": json_value(dict(consumer.arguments)),
        "active": True,
        "activity_status": "up",
        "channel_details": details or {},
    }


def consumer_details(connections: Connections, queue: Queue, node: str) -> list[dict[str, Any]]:
    """The consumers of ``queue``, with their channels' details (``GET`` of one queue)."""
    by_channel = {
        id(channel): channel_details(entry, channel, node)
        for entry in connections
        for channel in entry.connection.channels.values()
    }
    return [consumer_json(c, queue, by_channel.get(id(c.channel))) for c in queue.consumers]


def _mine(user: ApiUser, entry: Registered) -> bool:
    """Whether ``user`` may see the connection: an administrator or a monitoring user any,
    another user only their own, as RabbitMQ shows them."""
    return user.sees_everything or _owns(user, entry)


def _owns(user: ApiUser, entry: Registered) -> bool:
    return _user(entry.connection) == user.name


async def _visible(request: Request) -> list[Registered]:
    """The connections the request's user may see, in the route's vhost (or every one)."""
    user = await api_user(request)
    vhosts = {v.name for v in await listed_vhosts(request, user)}
    return [
        entry
        for entry in connections_of(request)
        if entry.connection.vhost is not None
        and _vhost(entry.connection) in vhosts
        and _mine(user, entry)
    ]


async def list_connections(request: Request) -> Response:
    """``GET /api/connections`` and ``GET /api/vhosts/{vhost}/connections``."""
    node = broker_of(request).node_name
    entries = await _visible(request)
    return await listing(request, (connection_json(e, node) for e in entries))


async def _entry(request: Request, *, closing: bool = False) -> Registered:
    """The path's connection, if the user may see it (404 otherwise) and, ``closing``, close it:
    an administrator or the connection's own user (401 otherwise, RabbitMQ's words: a
    monitoring user sees every connection and closes none but its own)."""
    user = await api_user(request)
    entry = connections_of(request).get(segment(request, "name"))
    if entry is None or not user.may_open(_vhost(entry.connection)) or not _mine(user, entry):
        raise not_found()
    if closing and not (user.is_administrator or _owns(user, entry)):
        raise ApiError(401, "not_authorised", "User not authorised to access object")
    return entry


async def show_connection(request: Request) -> Response:
    """``GET /api/connections/{name}``."""
    entry = await _entry(request)
    return JSONResponse(connection_json(entry, broker_of(request).node_name))


async def close_connection(request: Request) -> Response:
    """``DELETE /api/connections/{name}``: ``connection.close`` 320 with ``X-Reason``."""
    entry = await _entry(request, closing=True)
    entry.connection.shutdown(request.headers.get("x-reason") or DEFAULT_CLOSE_REASON)
    return Response(status_code=204)


async def connection_channels(request: Request) -> Response:
    """``GET /api/connections/{name}/channels``."""
    entry = await _entry(request)
    node = broker_of(request).node_name
    channels = list(entry.connection.channels.values())
    return await listing(request, (channel_json(entry, c, node) for c in channels))


async def list_channels(request: Request) -> Response:
    """``GET /api/channels`` and ``GET /api/vhosts/{vhost}/channels``."""
    node = broker_of(request).node_name
    entries = await _visible(request)
    return await listing(
        request,
        (
            channel_json(entry, channel, node)
            for entry in entries
            for channel in list(entry.connection.channels.values())
        ),
    )


async def show_channel(request: Request) -> Response:
    """``GET /api/channels/{name}``."""
    user = await api_user(request)
    wanted = segment(request, "name")
    node = broker_of(request).node_name
    for entry in connections_of(request):
        for channel in list(entry.connection.channels.values()):
            if (
                channel_name(entry, channel) == wanted
                and user.may_open(channel.vhost.name)
                and _mine(user, entry)
            ):
                return JSONResponse(channel_json(entry, channel, node))
    raise not_found()


async def list_consumers(request: Request) -> Response:
    """``GET /api/consumers`` and ``GET /api/consumers/{vhost}``."""
    node = broker_of(request).node_name
    found = []
    for entry in await _visible(request):
        for channel in list(entry.connection.channels.values()):
            details = channel_details(entry, channel, node)
            for consumer in list(channel.consumers.values()):
                found.append(consumer_json(consumer, consumer.queue, details))
    return await listing(request, found)
