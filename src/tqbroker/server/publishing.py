"""``basic.publish`` up to the queues: the checks a publish passes, the message it makes, and its
routing.

Responsibilities:
- the checks, in RabbitMQ's order (the channel refuses ``immediate`` and runs the user's
  permission checks, ``access.py``, around these steps): ``publish_exchange`` (found, not
  internal); ``make_message`` / ``make_messages`` validate the properties as a full decode
  would (decoding them only if memoised or needed: reply-to, expiration), and a ``reply_to`` of
  the direct reply-to pseudo-queue becomes the channel's reply address;
- ``route_run``: the messages of one run of publishes (one method), routed once and enqueued
  together where the route holds for all of them, else one by one;
- ``route``: replies to a direct reply-to address, sender-selected distribution (``CC`` and
  ``BCC`` headers; ``BCC`` removed before delivery), the exchange's routing, enqueueing; what a
  confirm must wait for, whether a queue refused the message, and the message to return when
  it was ``mandatory`` and reached no queue; the exchange's and the channel's counters of it
  (``broker/stats.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

import attrs

from ..broker.deadletter import parse_expiration
from ..broker.exchange import Exchange
from ..broker.queue import Queue
from ..broker.reply_to import REPLY_TO, REPLY_TO_PREFIX
from ..broker.routing import ConfirmRun
from ..broker.stats import MessageStats
from ..broker.vhost import VirtualHost
from ..model import Message
from ..protocol.errors import AMQPError, DecodeError, ReplyCode
from ..protocol.methods import HEADERS_FLAG, BasicProperties, BasicPublish
from ..protocol.properties import check_properties
from .confirms import Wait
from .reply_to import ReplyTo

log = logging.getLogger(__name__)

# The headers property's bit in the first byte of the property flags.
_HEADERS_FLAG_HIGH = HEADERS_FLAG >> 8
# What the default exchange is routed with (it reads only the routing key).
_NO_PROPERTIES = BasicProperties()


# What routing a publish did: the flushes its confirm waits for, whether a queue's storage
# refused it (the publish is nacked), and the message to return (``basic.return``) when it was
# mandatory and reached no queue. A tuple: this is every publish's path.
Routed = tuple[list[Wait], bool, Message | None]


def publish_exchange(vhost: VirtualHost, method: BasicPublish) -> Exchange:
    """The exchange a publish goes to (404 if missing, 403 if internal)."""
    exchange = vhost.get_exchange(method.exchange)
    if exchange.internal:
        raise AMQPError(
            ReplyCode.ACCESS_REFUSED,
            f"cannot publish to internal exchange '{exchange.name}' in vhost '{vhost.name}'",
        )
    return exchange


def make_message(
    method: BasicPublish,
    properties_raw: bytes,
    body: bytes,
    timestamp_ms: int,
    reply_to: ReplyTo,
) -> Message:
    """The message a publish makes, its properties checked."""
    # Validated here as a full decode would (a bad block is refused before routing), but
    # decoded only if memoised or needed (reply-to, expiration, headers); else None: the
    # message decodes them if something asks.
    try:
        properties = check_properties(properties_raw)
    except DecodeError as exc:
        raise AMQPError(ReplyCode.FRAME_ERROR, f"cannot decode properties: {exc}") from None
    if properties is not None:
        if properties.reply_to == REPLY_TO:
            properties = attrs.evolve(properties, reply_to=reply_to.reply_address())
            properties_raw = properties.encode()
        if properties.expiration is not None:
            ttl = parse_expiration(properties.expiration)
            if isinstance(ttl, str):
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid expiration '{properties.expiration}': {ttl}",
                )
    return Message(
        method.exchange, method.routing_key, properties_raw, body, properties, timestamp_ms
    )


def make_messages(
    method: BasicPublish,
    properties: list[bytes],
    bodies: list[bytes],
    timestamp_ms: int,
    reply_to: ReplyTo,
) -> tuple[list[Message], AMQPError | None]:
    """``make_message`` for each publish of a run, in order: the messages up to the first
    refused, and its refusal (None: none). Properties that repeat the ones before (the same
    bytes object: the fast path shares a run's repeated properties) are checked and decoded
    once (with headers, each message decodes its own when asked: a table is mutable)."""
    messages: list[Message] = []
    checked: bytes | None = None  # the properties last checked, as sent
    stored = b""  # what they became (a direct reply-to address filled in)
    decoded: BasicProperties | None = None  # shared when immutable: no headers table
    exchange, routing_key = method.exchange, method.routing_key
    for raw, body in zip(properties, bodies, strict=True):
        if raw is checked:
            messages.append(Message(exchange, routing_key, stored, body, decoded, timestamp_ms))
            continue
        try:
            message = make_message(method, raw, body, timestamp_ms, reply_to)
        except AMQPError as exc:
            return messages, exc
        messages.append(message)
        checked, stored = raw, message.properties_raw
        decoded = None if stored[0] & _HEADERS_FLAG_HIGH else message.properties
    return messages, None


def route(
    vhost: VirtualHost, exchange: Exchange, message: Message, mandatory: bool, stats: MessageStats
) -> Routed:
    """Route and enqueue a message; count it in the exchange's stats (``publish_in``, and
    ``publish_out`` once per queue reached) and, when it reached none, in ``stats`` (the
    publishing channel's ``return_unroutable`` or ``drop_unroutable``)."""
    waits: list[Wait] = []
    refused = False
    exchange_stats = exchange.stats
    exchange_stats.publish_in += 1
    if exchange is vhost.default_exchange and message.routing_key.startswith(REPLY_TO_PREFIX):
        routed = vhost.deliver_reply(message.routing_key, message)
        if routed:
            exchange_stats.publish_out += 1
    else:
        if message.properties_raw[0] & _HEADERS_FLAG_HIGH:
            # Sender-selected distribution: routed on CC and BCC keys too; BCC never delivered.
            headers = message.properties.headers
            queues = vhost.route_keys(exchange, message.routing_keys(bcc=True), message.properties)
            if headers and "BCC" in headers:
                message = message.with_headers({k: v for k, v in headers.items() if k != "BCC"})
        else:
            # No headers: no CC or BCC keys. The default exchange routes by the routing key
            # alone, so properties a publish left undecoded stay so.
            queues = vhost.route(
                exchange,
                message.routing_key,
                _NO_PROPERTIES if exchange is vhost.default_exchange else message.properties,
            )
        waits, refused = vhost.enqueue(queues, message)
        if queues:
            exchange_stats.publish_out += len(queues)
        # A destination that holds the message to route it later (x-delayed-message) is not
        # a route yet: a mandatory message reaching only such is returned, as in RabbitMQ.
        routed = bool(queues) and (
            not mandatory or any(isinstance(queue, Queue) for queue in queues)
        )
    if routed:
        return waits, refused, None
    if mandatory:
        stats.return_unroutable += 1
        return waits, refused, message
    stats.drop_unroutable += 1
    return waits, refused, None


def route_run(
    vhost: VirtualHost,
    exchange: Exchange,
    messages: list[Message],
    mandatory: bool,
    stats: MessageStats,
    write_return: Callable[[Message], None],
) -> list[ConfirmRun]:
    """``route`` for the messages of a run of publishes (one method: the same exchange,
    routing key and mandatory flag), in order: what their confirms wait for, as runs; a
    message to return is handed to ``write_return`` at once (before what routing the next
    one delivers). The first is routed alone; when its route is known to hold for the
    others (``Routing.memoised``: no router is asked) and none has headers (no CC or BCC
    keys), they go there together (``Routing.enqueue_run``), else one by one."""
    first = messages[0]
    waits, refused, returned = route(vhost, exchange, first, mandatory, stats)
    confirms: list[ConfirmRun] = [(1, waits, refused)]
    if returned is not None:
        write_return(returned)
    rest = messages[1:]
    if not rest:
        return confirms
    routing_key = first.routing_key
    queues = (
        None
        if exchange is vhost.default_exchange and routing_key.startswith(REPLY_TO_PREFIX)
        else vhost.routing.memoised(exchange, routing_key)
    )
    if (
        not queues
        or not all(isinstance(queue, Queue) for queue in queues)
        or any(message.properties_raw[0] & _HEADERS_FLAG_HIGH for message in rest)
    ):
        for message in rest:
            waits, refused, returned = route(vhost, exchange, message, mandatory, stats)
            confirms.append((1, waits, refused))
            if returned is not None:
                write_return(returned)
        return confirms
    exchange_stats = exchange.stats
    exchange_stats.publish_in += len(rest)
    exchange_stats.publish_out += len(rest) * len(queues)
    return confirms + vhost.routing.enqueue_run(cast(tuple[Queue, ...], queues), rest)
