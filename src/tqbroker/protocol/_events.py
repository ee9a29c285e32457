"""What ``ServerConnection.next_event`` returns: the events of a client connection.

Responsibilities:
- ``NEED_DATA``: nothing complete yet;
- the events: the protocol header, a method, complete publishes (one or a run of them with the
  same method: the method, raw properties and bodies), the end of the stream.
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


@attrs.define
class ContentReceived:
    """One or more complete ``basic.publish`` in a row on one channel with the same method: the
    method, then each publish's raw property bytes (flags word first, as sent, so deliveries
    can forward them untouched) and body, in order (``properties[i]`` goes with ``bodies[i]``).

    Read-only by convention, not frozen: a frozen attrs ``__init__`` costs three times as much,
    and the publish path makes one of these per read at least."""

    channel: int
    method: BasicPublish
    properties: list[bytes]
    bodies: list[bytes]


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
