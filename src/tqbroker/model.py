"""Messages as the broker keeps them.

Responsibilities:
- ``Message``: exchange, routing key, the content-header properties exactly as the publisher sent
  them (forwarded to consumers without re-encoding) and the body; the decoded
  ``BasicProperties`` on demand;
- ``timestamp_ms``: when the broker accepted the message (``tqbroker.clock.now_ms``, wall-clock
  milliseconds); TTLs count from it and durable backends store it with the message.
"""

from __future__ import annotations

import attrs

from .protocol.codec import FieldTable
from .protocol.methods import BasicProperties


class Message:
    """One published message. Immutable once routed; shared by every queue it was routed to."""

    __slots__ = (
        "_names",
        "_properties",
        "body",
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
        self.properties_raw = properties_raw
        self.body = body
        self._properties = properties
        self.timestamp_ms = timestamp_ms
        self._names: bytes | None = None

    @property
    def properties(self) -> BasicProperties:
        """The decoded properties (decoded once, on first use)."""
        if self._properties is None:
            self._properties = BasicProperties.decode(memoryview(self.properties_raw))
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

    @property
    def encoded_names(self) -> bytes:
        """Exchange and routing key as two shortstrs, as ``basic.deliver`` carries them; encoded
        once per message however many queues and consumers it reaches."""
        if self._names is None:
            exchange, routing_key = self.exchange.encode(), self.routing_key.encode()
            self._names = (
                bytes((len(exchange),)) + exchange + bytes((len(routing_key),)) + routing_key
            )
        return self._names

    def __repr__(self) -> str:
        return (
            f"Message(exchange={self.exchange!r}, routing_key={self.routing_key!r}, "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''})"
        )
