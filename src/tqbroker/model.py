"""Messages as the broker keeps them.

Responsibilities:
- ``Message``: exchange, routing key, the content-header properties exactly as the publisher sent
  them (forwarded to consumers without re-encoding) and the body; the decoded
  ``BasicProperties`` on demand;
- ``timestamp_ms``: when the broker accepted the message (``tqbroker.clock.now_ms``, wall-clock
  milliseconds); TTLs count from it and durable backends store it with the message;
- ``write_deliver``: its ``basic.deliver``, reusing across deliveries the exchange and routing
  key as shortstrs and, from its second delivery on a channel number, its content frames'
  heads;
- ``with_long_header``: a copy with one more header, spliced into the encoded properties.
"""

from __future__ import annotations

import attrs

from .protocol.codec import FieldTable, Long, add_long_header
from .protocol.frames import FRAME_OVERHEAD
from .protocol.frames import deliver_content as _deliver_content
from .protocol.frames import write_deliver as _write_deliver
from .protocol.frames import write_deliver_content as _write_deliver_content
from .protocol.methods import BasicProperties
from .protocol.properties import decode_properties


class Message:
    """One published message. Immutable once routed; shared by every queue it was routed to."""

    __slots__ = (
        "_encoded",
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
        # None until first delivered; then the exchange and routing key as shortstrs
        # (``encoded_names``); from a second delivery (``write_deliver``) the channel number
        # and the content encoded for it.
        self._encoded: bytes | tuple[int, bytes] | None = None

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

    def with_long_header(self, name: str, value: int) -> Message:
        """A copy with header ``name`` set to ``value`` as a signed 64-bit long (``Long``), at the
        end of the headers unless it was there. The header is spliced into the encoded properties
        (``codec.add_long_header``), without decoding and re-encoding them; if it cannot be
        (``name`` may already be there), this is ``with_headers``."""
        raw = add_long_header(self.properties_raw, name, value)
        if raw is None:
            headers = self.properties.headers or {}
            return self.with_headers({**headers, name: Long(value)})
        return Message(
            self.exchange, self.routing_key, raw, self.body, timestamp_ms=self.timestamp_ms
        )

    @property
    def encoded_names(self) -> bytes:
        """Exchange and routing key as two shortstrs, as ``basic.deliver`` carries them; encoded
        once per message however many queues and consumers it reaches."""
        encoded = self._encoded
        if isinstance(encoded, bytes):
            return encoded
        names = self._encode_names()
        if encoded is None:
            self._encoded = names
        return names

    def _encode_names(self) -> bytes:
        exchange, routing_key = self.exchange.encode(), self.routing_key.encode()
        return bytes((len(exchange),)) + exchange + bytes((len(routing_key),)) + routing_key

    def write_deliver(
        self,
        out: bytearray,
        channel: int,
        consumer_tag: bytes,
        delivery_tag: int,
        redelivered: bool,
        frame_max: int,
    ) -> None:
        """Append a ``basic.deliver`` of this message (``frames.write_deliver``;
        ``consumer_tag`` as a shortstr). The first delivery encodes it in full and keeps the
        names (``encoded_names``); a further one on a channel number encodes the content
        frames' heads there once (``frames.deliver_content``) and reuses them for the next
        deliveries on that number (fanout, requeue). Only the latest channel number's are
        kept: a message delivered once (most) keeps only its names, as it did before."""
        body = self.body
        size = len(body)
        encoded = self._encoded
        one_frame = size and (not frame_max or size <= frame_max - FRAME_OVERHEAD)
        if one_frame and isinstance(encoded, tuple) and encoded[0] == channel:
            content = encoded[1]
        else:
            names = self.encoded_names  # kept from the first delivery on
            if encoded is None or not one_frame:  # the first delivery, or several body frames
                _write_deliver(
                    out,
                    channel,
                    consumer_tag,
                    delivery_tag,
                    redelivered,
                    names,
                    self.properties_raw,
                    body,
                    frame_max,
                )
                return
            content = _deliver_content(channel, names, self.properties_raw, size)
            self._encoded = (channel, content)
        _write_deliver_content(
            out,
            channel,
            consumer_tag,
            delivery_tag,
            redelivered,
            content,
            len(self.properties_raw),
            body,
        )

    def __repr__(self) -> str:
        return (
            f"Message(exchange={self.exchange!r}, routing_key={self.routing_key!r}, "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''})"
        )
