"""Message expiry and dead-lettering, as RabbitMQ defines them (https://www.rabbitmq.com/docs/ttl,
https://www.rabbitmq.com/docs/dlx).

Responsibilities:
- per-message TTL: validating the ``expiration`` property at publish, reading it cheaply when a
  queue asks when a message expires;
- the dead-lettered copy of a message: the ``x-death`` history (one entry per queue and reason,
  most recent first, with ``count``, ``reason``, ``queue``, ``time``, ``exchange``,
  ``routing-keys`` and ``original-expiration``), ``x-first-death-*`` and ``x-last-death-*``, the
  ``expiration`` property removed (so it cannot expire again), ``CC`` dropped when the queue sets
  a dead-letter routing key;
- cycle detection: a message that would come back to a queue it was dead-lettered from is dropped
  there unless a consumer rejected it somewhere along the cycle.

Pure functions over ``Message``; the vhost routes the copies.
"""

from __future__ import annotations

import datetime
from typing import Final, Literal

import attrs

from ..model import Message
from ..protocol.codec import FieldTable, FieldValue

Reason = Literal["rejected", "expired", "maxlen", "delivery_limit"]

# Bit of the content header's property-flags word that says ``expiration`` is present.
_EXPIRATION_FLAG: Final = 0x01  # in the first byte (0x0100 of the word)
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def check_expiration(value: str) -> str | None:
    """Why ``value`` is not a valid ``expiration`` property (None if it is): RabbitMQ wants a
    non-negative integer number of milliseconds written in decimal."""
    if not value.isascii() or not value.lstrip("-").isdigit():
        return "no_integer"
    if int(value) < 0:
        return f"{{value_negative,{int(value)}}}"
    return None


def message_ttl(message: Message) -> int | None:
    """The message's own TTL in milliseconds, or None. Reads the property flags first, so
    messages without ``expiration`` cost no properties decode."""
    raw = message.properties_raw
    if not raw or not raw[0] & _EXPIRATION_FLAG:
        return None
    expiration = message.properties.expiration
    if expiration is None or check_expiration(expiration) is not None:
        return None
    return int(expiration)


def routing_keys(message: Message) -> list[str]:
    """The keys a message was routed with: its routing key and its ``CC`` keys."""
    keys = [message.routing_key]
    headers = message.properties.headers
    cc = headers.get("CC") if headers else None
    if isinstance(cc, list):
        keys.extend(key for key in cc if isinstance(key, str))
    return keys


def dead_lettered(
    message: Message,
    *,
    queue: str,
    reason: Reason,
    exchange: str,
    routing_key: str | None,
    now_ms: int,
) -> Message:
    """The copy of ``message`` that queue ``queue`` dead-letters to ``exchange``, routed with
    ``routing_key`` (the queue's ``x-dead-letter-routing-key``) or, when None, with the keys
    the message was published with."""
    properties = message.properties
    headers: dict[str, FieldValue] = dict(properties.headers or {})
    time = _EPOCH + datetime.timedelta(seconds=now_ms // 1000)
    deaths = [d for d in _deaths(headers) if not _same_death(d, queue, reason)]
    previous = next((d for d in _deaths(headers) if _same_death(d, queue, reason)), None)
    count = previous.get("count") if previous is not None else 0
    entry: dict[str, FieldValue] = {
        "count": (count if isinstance(count, int) else 0) + 1,
        "reason": reason,
        "queue": queue,
        "time": time,
        "exchange": message.exchange,
        "routing-keys": list[FieldValue](routing_keys(message)),
    }
    if properties.expiration is not None:
        entry["original-expiration"] = properties.expiration
    headers["x-death"] = [entry, *deaths]
    for key, value in (("reason", reason), ("queue", queue), ("exchange", message.exchange)):
        headers.setdefault(f"x-first-death-{key}", value)
        headers[f"x-last-death-{key}"] = value
    if routing_key is not None:
        headers.pop("CC", None)
    properties = attrs.evolve(properties, headers=headers, expiration=None)
    return Message(
        exchange,
        routing_key if routing_key is not None else message.routing_key,
        properties.encode(),
        message.body,
        properties,
        timestamp_ms=now_ms,
    )


def is_cycle(message: Message, target_queue: str) -> bool:
    """True when routing this dead-lettered message to ``target_queue`` closes a cycle with no
    rejection in it (RabbitMQ drops the message for that queue)."""
    deaths = _deaths(message.properties.headers or {})
    for death in deaths:
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == target_queue:
            return True
    return False


def _deaths(headers: FieldTable) -> list[dict[str, FieldValue]]:
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return []
    return [d for d in deaths if isinstance(d, dict)]


def _same_death(death: dict[str, FieldValue], queue: str, reason: str) -> bool:
    return death.get("queue") == queue and death.get("reason") == reason
