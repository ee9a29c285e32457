"""Messages as the broker keeps them.

Responsibilities:
- ``Message``: exchange, routing key, the content-header properties exactly as the publisher sent
  them (forwarded to consumers without re-encoding) and the body; the decoded
  ``BasicProperties`` on demand.
"""

from __future__ import annotations

from .protocol.methods import BasicProperties


class Message:
    """One published message. Immutable once routed; shared by every queue it was routed to."""

    __slots__ = ("_properties", "body", "exchange", "properties_raw", "routing_key")

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        properties: BasicProperties | None = None,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties_raw = properties_raw
        self.body = body
        self._properties = properties

    @property
    def properties(self) -> BasicProperties:
        """The decoded properties (decoded once, on first use)."""
        if self._properties is None:
            self._properties = BasicProperties.decode(memoryview(self.properties_raw))
        return self._properties

    def __repr__(self) -> str:
        return (
            f"Message(exchange={self.exchange!r}, routing_key={self.routing_key!r}, "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''})"
        )
