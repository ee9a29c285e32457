"""How many connections from one source address may be in their handshake at once.

A client that connects and then says nothing (or only the protocol header) costs the broker a
socket, a connection's tasks and its buffers until the handshake deadline closes it; one
address opening thousands of those would exhaust file descriptors and memory before any
password is checked. ``HandshakeAdmission`` refuses a new connection from an address that
already has ``limit`` connections between TCP accept and ``connection.open-ok``: it is closed
at once, before any AMQP is read. Connections that have opened a vhost do not count.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

log = logging.getLogger(__name__)

WARN_EVERY_S = 10.0  # at most one log line per address this often


class Ticket:
    """One admitted connection's place; ``release`` (idempotent) gives it back."""

    __slots__ = ("_admission", "_host")

    def __init__(self, admission: HandshakeAdmission | None, host: str) -> None:
        self._admission = admission
        self._host = host

    def release(self) -> None:
        admission, self._admission = self._admission, None
        if admission is not None:
            admission.release(self._host)


class HandshakeAdmission:
    """Connections in their handshake, per source address; ``limit`` 0 admits everything."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending: Counter[str] = Counter()
        self._warned_at: dict[str, float] = {}

    def admit(self, host: str) -> Ticket | None:
        """A ticket for a connection from ``host``, or None (close it) when that address has
        ``limit`` connections in their handshake already."""
        if not self.limit:
            return Ticket(None, host)
        if self._pending[host] >= self.limit:
            self._warn(host)
            return None
        self._pending[host] += 1
        return Ticket(self, host)

    def release(self, host: str) -> None:
        left = self._pending[host] - 1
        if left > 0:
            self._pending[host] = left
        else:
            del self._pending[host]

    def pending(self, host: str) -> int:
        return self._pending.get(host, 0)

    def _warn(self, host: str) -> None:
        now = time.monotonic()
        if now - self._warned_at.get(host, -WARN_EVERY_S) < WARN_EVERY_S:
            return
        if len(self._warned_at) > 10_000:
            self._warned_at.clear()
        self._warned_at[host] = now
        log.warning(
            "refusing connections from %s: %d connections from that address are in their "
            "handshake (max_pending_handshakes_per_address)",
            host,
            self.limit,
            extra={"peer_host": host},
        )
