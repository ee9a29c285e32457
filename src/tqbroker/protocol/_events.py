"""What ``ServerConnection.next_event`` returns: the events of a client connection.

Responsibilities:
- ``NEED_DATA``: nothing complete yet;
- the events: the protocol header, a method, a complete publish (method, raw properties, body),
  the end of the stream.
"""

from __future__ import annotations

import enum
import logging
from typing import Final

import attrs

from .methods import BasicPublish, Method

log = logging.getLogger(__name__)


class NeedData(enum.Enum):
    """``next_event`` has nothing complete to return yet."""

    NEED_DATA = enum.auto()


NEED_DATA: Final = NeedData.NEED_DATA


@attrs.frozen
class ProtocolHeaderReceived:
    """The client sent a valid ``AMQP 0-9-1`` header: answer with ``connection.start``."""


@attrs.frozen
class MethodReceived:
    """A method without content (everything except ``basic.publish``)."""

    channel: int
    method: Method


@attrs.define(unsafe_hash=True)
class ContentReceived:
    """A complete ``basic.publish``: the method, the raw property bytes (flags word first, as
    sent, so deliveries can forward them untouched) and the body.

    Read-only by convention, not frozen: a frozen attrs ``__init__`` costs three times as much,
    and one of these is made per published message."""

    channel: int
    method: BasicPublish
    properties: bytes
    body: bytes


@attrs.frozen
class EndOfStream:
    """The peer closed its side of the socket."""


Event = ProtocolHeaderReceived | MethodReceived | ContentReceived | EndOfStream

__all__ = [
    "NEED_DATA",
    "ContentReceived",
    "EndOfStream",
    "Event",
    "MethodReceived",
    "NeedData",
    "ProtocolHeaderReceived",
]
