"""The management API's bindings: ``/api/bindings[/{vhost}]``, one source and destination's
(``/api/bindings/{vhost}/e/{source}/q|e/{destination}``: GET lists, POST binds and answers the
new binding's ``Location``), one binding by its ``properties_key`` (GET, DELETE unbinds), and an
exchange's bindings as source or destination.

Every queue is bound to the default exchange by its name, as RabbitMQ lists it. A binding's
``properties_key`` is its routing key, percent-encoded, and for a binding with arguments ``~``
and a short digest of them (RabbitMQ's shape; the digest is tqbroker's own).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any, Literal
from urllib.parse import quote

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...broker.exchange import Exchange
from ...broker.queue import Queue
from ...broker.vhost import VirtualHost
from ...protocol.codec import FieldTable, encode_table
from ...recordbatch import json_value
from .mgmt_access import access_refused, binding_needs, require
from .mgmt_common import (
    api_user,
    api_vhost,
    json_body,
    listed_vhosts,
    listing,
    not_found,
    segment,
    short_string,
    table,
    topology_change,
)


@attrs.frozen
class Binding:
    vhost: str
    source: str
    destination: str
    destination_type: str  # "queue" or "exchange"
    routing_key: str
    arguments: FieldTable

    @property
    def properties_key(self) -> str:
        key = quote(self.routing_key, safe="")
        if not self.arguments:
            return key
        digest = hashlib.sha256(encode_table(self.arguments)).digest()[:6]
        return f"{key}~{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"


def binding_json(binding: Binding) -> dict[str, Any]:
    return {
        "source": binding.source,
        "vhost": binding.vhost,
        "destination": binding.destination,
        "destination_type": binding.destination_type,
        "routing_key": binding.routing_key,
        "arguments": json_value(dict(binding.arguments)),
        "properties_key": binding.properties_key,
    }


def _of_exchange(vhost: VirtualHost, exchange: Exchange) -> Iterator[Binding]:
    for (destination, key, _encoded), arguments in list(exchange.bindings.items()):
        if isinstance(destination, Queue):
            kind = "queue"
        elif isinstance(destination, Exchange):
            kind = "exchange"
        else:
            continue
        yield Binding(vhost.name, exchange.name, destination.name, kind, key, arguments)


def all_bindings(vhost: VirtualHost) -> Iterator[Binding]:
    """The vhost's bindings: the default exchange's first (one per queue), then the others'."""
    for queue in list(vhost.queues.values()):
        yield Binding(vhost.name, "", queue.name, "queue", queue.name, {})
    for exchange in list(vhost.exchanges.values()):
        if exchange is not vhost.default_exchange:
            yield from _of_exchange(vhost, exchange)


def bindings_of_queue(vhost: VirtualHost, queue: Queue) -> Iterator[Binding]:
    return (
        b
        for b in all_bindings(vhost)
        if b.destination_type == "queue" and b.destination == queue.name
    )


async def list_bindings(request: Request) -> Response:
    """``GET /api/bindings`` and ``GET /api/bindings/{vhost}``."""
    vhosts = await listed_vhosts(request)
    return await listing(request, (binding_json(b) for v in vhosts for b in all_bindings(v)))


def _kind(request: Request) -> Literal["queue", "exchange"]:
    """``q`` a queue, ``e`` an exchange (404 otherwise, as RabbitMQ)."""
    kind = request.path_params["kind"]
    if kind not in ("q", "e"):
        raise not_found()
    return "queue" if kind == "q" else "exchange"


def _between(vhost: VirtualHost, request: Request) -> list[Binding]:
    source, destination = segment(request, "source"), segment(request, "destination")
    kind = _kind(request)
    if source not in vhost.exchanges:
        raise not_found()
    if (vhost.queues if kind == "queue" else vhost.exchanges).get(destination) is None:
        raise not_found()
    return [
        b
        for b in all_bindings(vhost)
        if b.source == source and b.destination == destination and b.destination_type == kind
    ]


async def bindings_between(request: Request) -> Response:
    """``GET /api/bindings/{vhost}/e/{source}/q|e/{destination}``."""
    vhost = await api_vhost(request)
    return await listing(request, (binding_json(b) for b in _between(vhost, request)))


async def create_binding(request: Request) -> Response:
    """``POST /api/bindings/{vhost}/e/{source}/q|e/{destination}``: 201 and the ``Location``
    (``{destination}/{properties_key}``) of the binding."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    body = await json_body(request)
    source, destination = segment(request, "source"), segment(request, "destination")
    await require(request, user, vhost, *binding_needs(source, destination, _kind(request)))
    key = short_string(body.get("routing_key", ""), "'routing_key'")
    arguments = table(body.get("arguments"), "arguments")
    async with topology_change(vhost):
        if _kind(request) == "queue":
            queue = vhost.queues.get(destination)
            vhost.bind_queue(
                destination, source, key, arguments, queue.exclusive_owner if queue else None
            )
        else:
            vhost.bind_exchange(destination, source, key, arguments)
    binding = Binding(vhost.name, source, destination, _kind(request), key, arguments)
    location = f"{quote(destination, safe='')}/{binding.properties_key}"
    return Response(status_code=201, headers={"location": location})


def _one(vhost: VirtualHost, request: Request) -> Binding:
    wanted = segment(request, "props")
    for binding in _between(vhost, request):
        if binding.properties_key == wanted:
            return binding
    raise not_found()


async def show_binding(request: Request) -> Response:
    """``GET /api/bindings/{vhost}/e/{source}/q|e/{destination}/{props}``."""
    vhost = await api_vhost(request)
    return JSONResponse(binding_json(_one(vhost, request)))


async def delete_binding(request: Request) -> Response:
    """``DELETE /api/bindings/{vhost}/e/{source}/q|e/{destination}/{props}``."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    binding = _one(vhost, request)
    if binding.source == "":
        raise access_refused()
    needs = binding_needs(binding.source, binding.destination, _kind(request))
    await require(request, user, vhost, *needs)
    async with topology_change(vhost):
        if binding.destination_type == "queue":
            queue = vhost.queues.get(binding.destination)
            vhost.unbind_queue(
                binding.destination,
                binding.source,
                binding.routing_key,
                binding.arguments,
                queue.exclusive_owner if queue else None,
            )
        else:
            vhost.unbind_exchange(
                binding.destination, binding.source, binding.routing_key, binding.arguments
            )
    return Response(status_code=204)


async def exchange_bindings(request: Request) -> Response:
    """``GET /api/exchanges/{vhost}/{name}/bindings/source|destination``."""
    vhost = await api_vhost(request)
    name = segment(request, "name")
    if name not in vhost.exchanges and not (name == "amq.default"):
        raise not_found()
    name = "" if name == "amq.default" else name
    side = request.path_params["side"]
    if side not in ("source", "destination"):
        raise not_found()
    as_source = side == "source"
    found = [
        b
        for b in all_bindings(vhost)
        if (
            b.source == name
            if as_source
            else b.destination_type == "exchange" and b.destination == name
        )
    ]
    return await listing(request, (binding_json(b) for b in found))
