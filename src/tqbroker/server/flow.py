"""Blocking publishers during a resource alarm, RabbitMQ's way, for one connection.

A connection that publishes while an alarm is set (memory over its high watermark, free disk
under its limit: ``broker/alarms.py``) is blocked: it is told ``connection.blocked`` with the
reason (if its client announced the ``connection.blocked`` capability) and the broker stops
reading from it until every alarm has cleared, then tells it ``connection.unblocked``. TCP
pushes back on the publisher meanwhile. Deliveries to the connection's consumers go on; a
connection that only consumes is never blocked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from ..broker.alarms import ResourceAlarms
from ..protocol.methods import ConnectionBlocked, ConnectionUnblocked, Method
from .handshake import Handshake

log = logging.getLogger(__name__)


class PublisherFlow:
    def __init__(
        self,
        alarms: ResourceAlarms,
        send: Callable[[Method], None],
        handshake: Handshake,
        peer: str,
    ) -> None:
        self._alarms = alarms
        self._send = send  # a method on channel 0
        self._handshake = handshake  # what the client announced
        self._peer = peer
        self.published = False  # since the reader last looked
        self.blocked = False
        self._scope: trio.CancelScope | None = None

    async def pause_if_blocked(self) -> None:
        """Called by the reader before it reads again: while an alarm is set and the connection
        published since the last call, wait until every alarm has cleared."""
        published, self.published = self.published, False
        if not published or not self._alarms.active:
            return
        self.blocked = True
        notified = self._handshake.capabilities.get("connection.blocked") is True
        log.info("connection %s blocked: %s", self._peer, self._alarms.reason)
        if notified:
            self._send(ConnectionBlocked(self._alarms.reason))
        with trio.CancelScope() as self._scope:
            await self._alarms.wait_cleared()
        self._scope = None
        self.blocked = False
        if self._alarms.active:
            return  # interrupted: the connection is closing
        log.info("connection %s unblocked", self._peer)
        if notified:
            self._send(ConnectionUnblocked())

    def interrupt(self) -> None:
        """Stop waiting (the connection is closing and must read the peer's close-ok)."""
        if self._scope is not None:
            self._scope.cancel()
