"""Messages as the broker keeps them.

Responsibilities:
- ``Message``: exchange, routing key, the content-header properties exactly as the publisher sent
  them (forwarded to consumers without re-encoding) and the body; the decoded
  ``BasicProperties`` on demand;
- ``timestamp_ms``: when the broker accepted the message (``tqbroker.clock.now_ms``, wall-clock
  milliseconds); TTLs count from it and durable backends store it with the message;
- ``delivery_cache``: an opaque slot owned by the server layer (``server/encoding.py`` keeps
  the message's encoded ``basic.deliver`` parts there); the model never reads it;
- ``with_long_header``: encoded properties with one more header, spliced in;
- ``shared_raw``: small property blocks shared between messages (one object per distinct block).
"""

from __future__ import annotations

import attrs

from .protocol.codec import FieldTable, Long, LongHeaderSplicer
from .protocol.methods import BasicProperties
from .protocol.properties import decode_properties

_SHARED_LIMIT = 64  # raw property blocks up to this size are shared between messages
_SHARED_MAX = 4096  # distinct blocks remembered (the table is emptied when it is full)
_shared_raw: dict[bytes, bytes] = {}


def shared_raw(raw: bytes) -> bytes:
    """One bytes object for every equal small property block (most publishers send the same
    few: 35 B less per queued message); larger or too many distinct blocks pass through."""
    if len(raw) > _SHARED_LIMIT:
        return raw
    found = _shared_raw.get(raw)
    if found is None:
        if len(_shared_raw) >= _SHARED_MAX:
            _shared_raw.clear()
        found = _shared_raw[raw] = raw
    return found


_splicer = LongHeaderSplicer()


class Message:
    """One published message. Immutable once routed; shared by every queue it was routed to."""

    __slots__ = (
        "_properties",
        "body",
        "delivery_cache",
        "exchange",
        "properties_raw",
        "routing_key",
        "timestamp_ms",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        properties: BasicProperties | None = None,
        timestamp_ms: int = 0,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties_raw = shared_raw(properties_raw)
        self.body = body
        self._properties = properties
        self.timestamp_ms = timestamp_ms
        # Owned by the server layer, which caches the message's wire encoding here
        # (``server.encoding``); None until first delivered.
        self.delivery_cache: object | None = None

    @property
    def properties(self) -> BasicProperties:
        """The decoded properties (decoded once, on first use; blocks without headers are
        decoded once for every message that has the same bytes: ``decode_properties``)."""
        if self._properties is None:
            self._properties = decode_properties(self.properties_raw)
        return self._properties

    def routing_keys(self, *, bcc: bool = False) -> list[str]:
        """The keys the message is routed with: its routing key, plus RabbitMQ's sender-selected
        distribution keys, the ``CC`` header's (and ``BCC``'s, with ``bcc``) strings."""
        headers = self.properties.headers
        keys = [self.routing_key]
        for name in ("CC", "BCC") if bcc else ("CC",):
            extra = headers.get(name) if headers else None
            if isinstance(extra, list):
                keys.extend(key for key in extra if isinstance(key, str))
        return keys

    def with_headers(self, headers: FieldTable) -> Message:
        """A copy with other headers (properties re-encoded; body and timestamp shared). The
        stored message stays as published."""
        properties = attrs.evolve(self.properties, headers=headers)
        return Message(
            self.exchange,
            self.routing_key,
            properties.encode(),
            self.body,
            properties,
            timestamp_ms=self.timestamp_ms,
        )

    def __repr__(self) -> str:
        return (
            f"Message(exchange={self.exchange!r}, routing_key={self.routing_key!r}, "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''})"
        )


def with_long_header(properties_raw: bytes, name: str, value: int) -> bytes:
    """Encoded properties ``properties_raw`` with header ``name`` set to ``value`` as a signed
    64-bit long (``Long``), at the end of the headers unless it was there. The header is spliced
    into the encoded properties (``codec.LongHeaderSplicer``: the bytes the publisher sent are
    kept), without decoding and re-encoding them; if it cannot be (``name`` may already be
    there), the properties are decoded, the header set, and encoded again."""
    raw = _splicer.splice(properties_raw, name, value)
    if raw is None:
        properties = decode_properties(properties_raw)
        headers = {**(properties.headers or {}), name: Long(value)}
        raw = attrs.evolve(properties, headers=headers).encode()
    return raw
