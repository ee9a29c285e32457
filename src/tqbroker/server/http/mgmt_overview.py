"""The management API's node-wide routes: ``/api/overview``, ``/api/whoami``, ``/api/nodes
[/{name}]``, ``/api/vhosts[/{vhost}]``, ``/api/cluster-name``, ``/api/aliveness-test/{vhost}``
and the health checks ``virtual-hosts``, ``port-listener/{port}`` and
``ready-to-serve-clients``.

``rabbitmq_version`` names the RabbitMQ release whose management API this one follows;
``product_name`` and ``product_version`` name tqbroker.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..._version import __version__
from ...broker.broker import Broker
from ...broker.classic import ClassicQueue
from ...broker.declaring import open_and_declare_queue
from ...broker.pacing import Pacer
from ...broker.stats import COUNTERS, message_stats
from ...broker.vhost import VirtualHost
from ...model import Message
from ...protocol.errors import AMQPError
from ...protocol.methods import BasicProperties
from ..registry import Connections
from .auth import broker_of
from .cluster_state import cluster_of, node_json, node_name
from .errors import ApiError
from .mgmt_common import api_user, api_vhost, listing, not_found, segment, visible_vhosts
from .mgmt_connections import connections_of

API_VERSION = "3.10.8"  # the RabbitMQ management API this one follows
_STARTED = time.monotonic()
ALIVENESS_QUEUE = "aliveness-test"


async def _totals(vhosts: list[VirtualHost]) -> dict[str, int]:
    """Messages (ready, unacknowledged, both) and consumers across ``vhosts``' queues: a long
    walk, paced."""
    ready = unacked = consumers = 0
    pacer = Pacer()
    for vhost in vhosts:
        for queue in list(vhost.queues.values()):
            if queue.deleted:
                continue
            ready += queue.message_count
            consumers += len(queue.consumers)
            if isinstance(queue, ClassicQueue):
                unacked += queue.store.unacked_count
            await pacer.step()
    return {
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "consumers": consumers,
    }


def _exchange_types(broker: Broker) -> list[dict[str, Any]]:
    return [
        {"name": name, "description": f"{name} exchange", "enabled": True}
        for name in sorted(broker.exchange_types)
    ]


def _listeners(request: Request) -> list[dict[str, Any]]:
    node = broker_of(request).node_name
    return [
        {"node": node, "protocol": protocol, "ip_address": ip, "port": port}
        for protocol, ip, port in connections_of(request).listeners
    ]


async def overview(request: Request) -> Response:
    """``GET /api/overview``."""
    user = await api_user(request)
    broker = broker_of(request)
    vhosts = visible_vhosts(broker, user)
    connections = [
        e for e in connections_of(request) if user.may_open(getattr(e.connection.vhost, "name", ""))
    ]
    channels = sum(len(e.connection.channels) for e in connections)
    totals = await _totals(vhosts)
    consumers = totals.pop("consumers")
    return JSONResponse(
        {
            "management_version": API_VERSION,
            "rabbitmq_version": API_VERSION,
            "product_name": "tqbroker",
            "product_version": __version__,
            "rates_mode": "basic",
            "cluster_name": broker.node_name,
            "node": broker.node_name,
            "exchange_types": _exchange_types(broker),
            "listeners": _listeners(request),
            # The node's counters are for administrators and monitoring users (another user's
            # vhosts are in them).
            "message_stats": message_stats(broker.stats) if user.sees_everything else {},
            "queue_totals": totals,
            "object_totals": {
                "channels": channels,
                "connections": len(connections),
                "consumers": consumers,
                "exchanges": sum(len(v.exchanges) for v in vhosts),
                "queues": sum(len(v.queues) for v in vhosts),
            },
            "statistics_db_event_queue": 0,
            "alarms": sorted(broker.alarms.active),
        }
    )


async def whoami(request: Request) -> Response:
    """``GET /api/whoami`` (tags as ``mgmt_users`` gives them)."""
    user = await api_user(request)
    return JSONResponse({"name": user.name, "tags": sorted(user.tags)})


async def cluster_name(request: Request) -> Response:
    """``GET /api/cluster-name``."""
    await api_user(request)
    return JSONResponse({"name": broker_of(request).node_name})


def node_stats(broker: Broker, connections: Connections) -> dict[str, Any]:
    """This node as RabbitMQ's ``/api/nodes`` shows one (also sent to the other nodes of a
    cluster, which show it in theirs)."""
    memory, disk = broker.memory_monitor, broker.disk_monitor
    active = broker.alarms.active
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "name": broker.node_name,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "uptime": int((time.monotonic() - _STARTED) * 1000),
        "processors": os.cpu_count() or 1,
        "rates_mode": "basic",
        "mem_used": memory.used,
        "mem_limit": memory.limit,
        "mem_alarm": any("memory" in a for a in active),
        "disk_free": disk.free,
        "disk_free_limit": disk.limit,
        "disk_free_alarm": any("disk" in a for a in active),
        "fd_used": _open_descriptors(),
        "fd_total": soft,
        "sockets_used": len(connections),
        "partitions": [],
        "exchange_types": _exchange_types(broker),
        "applications": [{"name": "tqbroker", "description": "tqbroker", "version": __version__}],
    }


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


async def _nodes_json(request: Request) -> list[dict[str, Any]]:
    """This node's object, and in a cluster every other node's: its own stats (over the
    node-to-node link) where it answers, and what the view knows (its addresses under
    ``cluster``); a member that is down is ``running: false``, as RabbitMQ shows it."""
    here = node_stats(broker_of(request), connections_of(request))
    node = cluster_of(request)
    if node is None:
        return [here]
    view = node.view
    found = {here["name"]: here}
    others = [r for r in view.nodes.values() if r.node != node.node_id]
    stats: dict[str, dict[str, Any] | None] = {}

    async def ask(name: str) -> None:
        stats[name] = await node.stats_of(name)

    async with trio.open_nursery() as nursery:
        for record in others:
            nursery.start_soon(ask, record.node)
    for record in view.nodes.values():
        described = node_json(record, view.controller)
        if record.node == node.node_id:
            here["cluster"] = described
            continue
        answer = stats.get(record.node) or {"type": "disc", "running": True}
        found[described["name"]] = {**answer, "name": described["name"], "cluster": described}
    for member in node.known_nodes() - set(view.nodes):
        found[node_name(member)] = {"name": node_name(member), "type": "disc", "running": False}
    return [found[name] for name in sorted(found)]


async def nodes(request: Request) -> Response:
    """``GET /api/nodes``: this node, and in a cluster every registered node."""
    await api_user(request)
    return await listing(request, await _nodes_json(request))


async def node(request: Request) -> Response:
    """``GET /api/nodes/{name}``."""
    await api_user(request)
    wanted = segment(request, "name")
    for found in await _nodes_json(request):
        if found["name"] == wanted:
            return JSONResponse(found)
    raise not_found()


async def _vhost_json(
    vhost: VirtualHost, node: str, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    totals = await _totals([vhost])
    del totals["consumers"]
    metadata = metadata or {}
    default = "Default virtual host" if vhost.name == "/" else ""
    description, tags = metadata.get("description", default), metadata.get("tags", [])
    found: dict[str, Any] = {
        "name": vhost.name,
        "description": description,
        "tags": tags,
        "metadata": {"description": metadata.get("description", ""), "tags": tags},
        "default_queue_type": "classic",
        "tracing": False,
        "cluster_state": {node: "running"},
        **totals,
    }
    stats = message_stats(vhost.stats, COUNTERS)
    if stats:
        found["message_stats"] = stats
    return found


async def vhosts(request: Request) -> Response:
    """``GET /api/vhosts``."""
    user = await api_user(request)
    broker = broker_of(request)
    found = [
        await _vhost_json(v, broker.node_name, broker.vhost_metadata.get(v.name))
        for v in visible_vhosts(broker, user)
    ]
    return await listing(request, found)


async def vhost(request: Request) -> Response:
    """``GET /api/vhosts/{vhost}``."""
    found = await api_vhost(request)
    broker = broker_of(request)
    metadata = broker.vhost_metadata.get(found.name)
    return JSONResponse(await _vhost_json(found, broker.node_name, metadata))


async def aliveness_test(request: Request) -> Response:
    """``GET /api/aliveness-test/{vhost}``: declare the ``aliveness-test`` queue, publish a
    message to it and get it back, as RabbitMQ does."""
    vhost = await api_vhost(request)
    try:
        queue = await open_and_declare_queue(
            vhost,
            ALIVENESS_QUEUE,
            passive=False,
            durable=False,
            exclusive=False,
            auto_delete=False,
            arguments={},
            owner=None,
        )
        properties = BasicProperties()
        message = Message("", ALIVENESS_QUEUE, properties.encode(), b"test_message", properties, 0)
        vhost.routing.enqueue([queue], message)
        entry = queue.get()
    except AMQPError as exc:
        return JSONResponse({"status": "failed", "reason": exc.text}, status_code=503)
    if not isinstance(entry, tuple):
        return JSONResponse({"status": "failed", "reason": "no message"}, status_code=503)
    queue.ack(entry[0], None)
    return JSONResponse({"status": "ok"})


async def virtual_hosts_check(request: Request) -> Response:
    """``GET /api/health/checks/virtual-hosts``: every vhost runs (a single node's always do)."""
    await api_user(request)
    return JSONResponse({"status": "ok"})


async def port_listener_check(request: Request) -> Response:
    """``GET /api/health/checks/port-listener/{port}``."""
    await api_user(request)
    try:
        port = int(request.path_params["port"])
    except ValueError:
        raise ApiError(400, "bad_request", "the port must be a number") from None
    ports = sorted({p for _protocol, _ip, p in connections_of(request).listeners})
    if port in ports:
        return JSONResponse({"status": "ok", "port": port})
    return JSONResponse(
        {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports},
        status_code=503,
    )


async def ready_to_serve_clients(request: Request) -> Response:
    """``GET /api/health/checks/ready-to-serve-clients``: 200 once the broker serves clients,
    503 while a resource alarm blocks publishers."""
    await api_user(request)
    broker = broker_of(request)
    if broker.alarms.active:
        return JSONResponse(
            {"status": "failed", "reason": "resource alarms in effect"}, status_code=503
        )
    return JSONResponse({"status": "ok"})


async def protocol_listener_check(request: Request) -> Response:
    """``GET /api/health/checks/protocol-listener/{protocol}`` (``amqp`` or ``amqp091``,
    ``http``, ``http/prometheus``)."""
    await api_user(request)
    wanted = segment(request, "protocol")
    protocol = "amqp" if wanted in ("amqp", "amqp091", "amqp0-9-1") else wanted
    protocols = sorted({p for p, _ip, _port in connections_of(request).listeners})
    if protocol in protocols:
        return JSONResponse({"status": "ok", "protocol": protocol})
    return JSONResponse(
        {
            "status": "failed",
            "reason": "No active listener",
            "missing": wanted,
            "protocols": protocols,
        },
        status_code=503,
    )


async def single_node_check(request: Request) -> Response:
    """``node-is-quorum-critical`` and ``node-is-mirror-sync-critical``: a single node never
    is."""
    await api_user(request)
    return JSONResponse({"status": "ok", "reason": "single node cluster"})


async def empty_list(request: Request) -> Response:
    """Routes of features tqbroker does not have, answered as RabbitMQ answers them when none
    is defined (``/api/policies``, ``/api/parameters``, ``/api/extensions``...)."""
    await api_user(request)
    return JSONResponse([])
