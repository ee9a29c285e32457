"""Message expiry and dead-lettering, as RabbitMQ defines them (https://www.rabbitmq.com/docs/ttl,
https://www.rabbitmq.com/docs/dlx).

Responsibilities:
- per-message TTL: validating the ``expiration`` property at publish, reading it cheaply when a
  queue asks when a message expires;
- the dead-lettered copy of a message: the ``x-death`` history (one entry per queue and reason,
  most recent first, with ``count``, ``reason``, ``queue``, ``time``, ``exchange``,
  ``routing-keys`` and ``original-expiration``; a repeated death increments ``count`` and moves
  its entry to the front), ``x-first-death-*`` and ``x-last-death-*``, the
  ``expiration`` property removed (so it cannot expire again), ``CC`` dropped when the queue sets
  a dead-letter routing key;
- cycle detection: a message that would come back to a queue it was dead-lettered from is dropped
  there unless a consumer rejected it somewhere along the cycle;
- ``dead_letter``: publishing a queue's expired, rejected, dropped or over-limit message to its
  dead-letter exchange (``Routing.publish``, as the broker republishes: uncounted; the vhost
  calls it for its queues, through ``QueueHost``).

Pure functions over ``Message``, but for ``dead_letter``, which publishes the copy.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Literal

import attrs

from .. import clock
from ..model import Message
from ..protocol.codec import FieldTable, FieldValue

if TYPE_CHECKING:
    from ..plugins.spec import Destination
    from .exchange import Exchange
    from .queue import Queue
    from .routing import Routing

log = logging.getLogger(__name__)

Reason = Literal["rejected", "expired", "maxlen", "delivery_limit"]

# Bit of the content header's property-flags word that says ``expiration`` is present.
_EXPIRATION_FLAG: Final = 0x01  # in the first byte (0x0100 of the word)
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_INTEGER_PREFIX: Final = re.compile(r"[+-]?[0-9]+")


def parse_expiration(value: str) -> int | str:
    """The ``expiration`` property in milliseconds, or why it is invalid, worded as RabbitMQ
    words it (it parses with Erlang's ``string:to_integer``: an optional sign and digits)."""
    match = _INTEGER_PREFIX.match(value)
    if match is None:
        return "no_integer"
    number = int(match.group(0))
    rest = value[match.end() :]
    if rest:
        return f'{{leftover_string,"{rest}"}}'
    if number < 0:
        return f"{{value_negative,{number}}}"
    return number


def message_ttl(message: Message) -> int | None:
    """The message's own TTL in milliseconds, or None. Reads the property flags first, so
    messages without ``expiration`` cost no properties decode."""
    raw = message.properties_raw
    if not raw or not raw[0] & _EXPIRATION_FLAG:
        return None
    expiration = message.properties.expiration
    ttl = parse_expiration(expiration) if expiration is not None else None
    return ttl if isinstance(ttl, int) else None


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
    deaths = _deaths(headers)
    previous = next((d for d in deaths if _same_death(d, queue, reason)), None)
    if previous is not None:
        # RabbitMQ counts a repeated death in the entry of the first and moves it to the front;
        # its time, exchange, routing keys and original expiration stay the first death's.
        count = previous.get("count")
        entry = {**previous, "count": (count if isinstance(count, int) else 0) + 1}
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "time": _EPOCH + datetime.timedelta(seconds=now_ms // 1000),
            "exchange": message.exchange,
            "routing-keys": list[FieldValue](message.routing_keys()),
        }
        if properties.expiration is not None:
            entry["original-expiration"] = properties.expiration
    deaths = [d for d in deaths if d is not previous]
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


def dead_letter(
    queue: Queue,
    message: Message,
    reason: Reason,
    *,
    exchanges: Mapping[str, Exchange],
    routing: Routing,
) -> None:
    """Route a message ``queue`` dead-letters to its dead-letter exchange, as RabbitMQ does:
    with the queue's dead-letter routing key, else the message's own keys (and ``CC``); not to
    queues that would close a cycle without a rejection; at most once (no confirm waits on it,
    and a target that refuses it drops it)."""
    arguments = queue.arguments
    assert arguments.dead_letter_exchange is not None
    exchange = exchanges.get(arguments.dead_letter_exchange)
    if exchange is None:  # RabbitMQ drops it too
        log.debug(
            "queue %r: dead-letter exchange %r missing", queue.name, arguments.dead_letter_exchange
        )
        return
    copy = dead_lettered(
        message,
        queue=queue.name,
        reason=reason,
        exchange=exchange.name,
        routing_key=arguments.dead_letter_routing_key,
        now_ms=clock.now_ms(),
    )

    def takes(target: Destination) -> bool:
        if is_cycle(copy, target.name):
            log.debug("dead-letter cycle through queue %r: message dropped", target.name)
            return False
        return True

    routing.publish(exchange, copy, to=takes)


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
