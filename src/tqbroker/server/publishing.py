"""``basic.publish`` up to the broker: the checks a publish passes and the message it makes.

Responsibilities, in RabbitMQ's order (the channel refuses ``immediate`` and runs the user's
permission checks, ``access.py``, around these steps):
- ``publish_exchange``: the exchange is found and not internal;
- ``make_message`` / ``make_messages``: the properties are validated as a full decode would
  (decoded only if memoised or needed: reply-to, expiration), and a ``reply_to`` of the direct
  reply-to pseudo-queue becomes the channel's reply address.

What a publish then does (routing, CC/BCC, direct reply-to, ``mandatory``, the counters) is the
broker's: ``broker/routing.py``'s ``Routing.publish`` and ``Routing.publish_run``.
"""

from __future__ import annotations

import attrs

from ..broker.deadletter import parse_expiration
from ..broker.exchange import Exchange
from ..broker.reply_to import REPLY_TO
from ..broker.vhost import VirtualHost
from ..model import Message
from ..protocol.errors import AMQPError, DecodeError, ReplyCode
from ..protocol.methods import HEADERS_FLAG, BasicProperties, BasicPublish
from ..protocol.properties import check_properties
from .reply_to import ReplyTo

# The headers property's bit in the first byte of the property flags.
_HEADERS_FLAG_HIGH = HEADERS_FLAG >> 8


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
