"""The management API's exchanges: ``/api/exchanges[/{vhost}[/{name}]]`` (GET; PUT declares;
DELETE with ``if-unused``) and ``/publish`` (POST: publish one message, answered with
``{"routed": ...}`` once it is as durable as a confirm would say). The default exchange is
``amq.default`` in paths, as in RabbitMQ.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ... import clock
from ...broker.exchange import Exchange
from ...broker.holding import open_holding_store
from ...broker.stats import message_stats
from ...broker.streams.durability import Durability
from ...broker.vhost import VirtualHost
from ...model import Message
from ...protocol.errors import AMQPError
from ...protocol.methods import BasicProperties
from ...recordbatch import json_value
from .auth import broker_of
from .errors import ApiError
from .mgmt_access import access_refused, require, require_publish
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
    segment,
    short_string,
    table,
    topology_change,
)
from .mgmt_queues import PROPERTY_NAMES

EXCHANGE_STATS = ("publish_in", "publish_out")
DEFAULT_NAME = "amq.default"
_NUMBER_PROPERTIES = frozenset(("delivery_mode", "priority", "timestamp"))
_TEXT_PROPERTIES = frozenset(PROPERTY_NAMES) - _NUMBER_PROPERTIES - {"headers"}


def exchange_json(exchange: Exchange) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": exchange.name,
        "vhost": exchange.vhost,
        "type": exchange.type_name,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": json_value(dict(exchange.arguments)),
    }
    if exchange.failure is not None:
        found["failure"] = exchange.failure
    stats = message_stats(exchange.stats, EXCHANGE_STATS)
    if stats:
        found["message_stats"] = stats
    return found


async def list_exchanges(request: Request) -> Response:
    """``GET /api/exchanges`` and ``GET /api/exchanges/{vhost}``."""
    vhosts = await listed_vhosts(request)
    return await listing(
        request, (exchange_json(e) for v in vhosts for e in list(v.exchanges.values()))
    )


def _name(request: Request) -> str:
    name = segment(request, "name")
    return "" if name == DEFAULT_NAME else name


def _exchange(vhost: VirtualHost, request: Request) -> Exchange:
    exchange = vhost.exchanges.get(_name(request))
    if exchange is None:
        raise not_found()
    return exchange


async def show_exchange(request: Request) -> Response:
    """``GET /api/exchanges/{vhost}/{name}``."""
    vhost = await api_vhost(request)
    found = exchange_json(_exchange(vhost, request))
    found["incoming"] = found["outgoing"] = []
    return JSONResponse(found)


async def declare_exchange(request: Request) -> Response:
    """``PUT /api/exchanges/{vhost}/{name}``: 201 created, 204 if it existed as asked."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    body = await json_body(request)
    name = short_string(_name(request), "the exchange name")
    if not name or name.startswith("amq."):
        raise access_refused()
    await require(request, user, vhost, ("exchange", name, "configure"))
    type_name = body.get("type", "direct")
    if not isinstance(type_name, str):
        raise bad_request("'type' must be a string")
    arguments = table(body.get("arguments"), "arguments")
    durable = flag(body, "durable", True)
    auto_delete, internal = flag(body, "auto_delete", False), flag(body, "internal", False)
    existed = name in vhost.exchanges
    async with topology_change(vhost):
        await open_holding_store(vhost, name, type_name, durable=durable, arguments=arguments)
        vhost.declare_exchange(
            name,
            type_name,
            passive=False,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
    return Response(status_code=204 if existed else 201)


async def delete_exchange(request: Request) -> Response:
    """``DELETE /api/exchanges/{vhost}/{name}`` (``?if-unused=true``)."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    exchange = _exchange(vhost, request)
    if not exchange.name or exchange.name.startswith("amq."):
        raise access_refused()
    await require(request, user, vhost, ("exchange", exchange.name, "configure"))
    async with topology_change(vhost):
        vhost.delete_exchange(exchange.name, if_unused=query_flag(request, "if-unused"))
    return Response(status_code=204)


async def publish(request: Request) -> Response:
    """``POST /api/exchanges/{vhost}/{name}/publish``: ``{"routed": true|false}``."""
    user = await api_user(request)
    vhost = await api_vhost(request, user)
    if _name(request) in vhost.exchanges:  # a missing one: 400 as basic.publish's 404
        await require_publish(request, user, vhost, _name(request))
    body = await json_body(request)
    routing_key = short_string(body.get("routing_key", ""), "'routing_key'")
    payload = _payload(body)
    properties = _properties(body.get("properties") or {})
    max_size = broker_of(request).config.max_message_size
    if len(payload) > max_size:
        raise bad_request(f"message size {len(payload)} is larger than the maximum {max_size}")
    try:
        exchange = vhost.get_exchange(_name(request))
        raw = properties.encode()
        message = Message(exchange.name, routing_key, raw, payload, properties, clock.now_ms())
        # Mandatory, as RabbitMQ's management plugin publishes: whether it was routed.
        vhost.stats.publish += 1
        waits, refused, returned, _ = vhost.routing.publish(
            exchange, message, mandatory=True, stats=vhost.stats
        )
    except AMQPError as exc:
        raise bad_request(str(exc)) from None
    except (ValueError, OverflowError) as exc:
        raise bad_request(f"cannot encode the properties: {exc}") from None
    with Durability() as durability:
        durability.add(waits)
        durable = await durability.wait()
    if refused or not durable:
        raise ApiError(503, "unavailable", "the message could not be stored")
    return JSONResponse({"routed": returned is None})


def _payload(body: dict[str, Any]) -> bytes:
    payload = body.get("payload", "")
    encoding = body.get("payload_encoding", "string")
    if not isinstance(payload, str):
        raise bad_request("'payload' must be a string")
    if encoding == "string":
        try:
            return payload.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request("'payload' is not valid Unicode text") from None
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise bad_request("'payload' is not valid base64") from None
    raise bad_request(f"'payload_encoding' must be string or base64, not {encoding!r}")


def _properties(given: object) -> BasicProperties:
    if not isinstance(given, dict):
        raise bad_request("'properties' must be a JSON object")
    fields: dict[str, Any] = {}
    for key, value in given.items():
        if key in _TEXT_PROPERTIES:
            fields[key] = short_string(str(value), f"property '{key}'")
        elif key in _NUMBER_PROPERTIES:
            high = 2**64 - 1 if key == "timestamp" else 255
            fields[key] = integer(given, key, 0, 0, high)
        elif key == "headers":
            fields[key] = table(value, "headers")
        else:
            raise bad_request(f"unknown property '{key}'")
    return BasicProperties(**fields)
