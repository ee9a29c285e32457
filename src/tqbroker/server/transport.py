"""The Trio side of one client connection (``Transport``): the read loop that feeds the
connection's AMQP session, the writer task, deadlines, background tasks, the fault boundary.

In the shape of hypercorn's ``trio/tcp_server.py``: this knows the stream, the nursery and the
clock, not AMQP. The session (``Session``: ``AMQPConnection`` in ``connection.py``) says what
the bytes mean, what goes back and by when the client must send more.

- The connection's nursery: the reader (the task that calls ``run``), the writer
  (``writer.py``: one ``send_all`` for everything queued since the last) and the session's
  background tasks (``start_soon``: ack timeouts, heartbeats).
- Each read waits first for the session's publisher flow (``flow.py``: publishers wait out a
  resource alarm) and for the writer to drain (a client that does not read what it is sent is
  not read from: TCP pushes back), then for the client's bytes until the session's deadline
  (``receive_deadline``); a missed deadline or a lost socket ends the connection.
- The fault boundary: an unexpected exception (a bug) escaping the reader or a background task
  goes to the session's ``internal_error`` (it closes this connection alone, with 541) rather
  than ending the nursery; a failing writer drops the socket.
- The end: the session releases what the connection held (``ended``, shielded), then the
  socket closes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from ..broker.stats import ConnectionStats
from .flow import PublisherFlow
from .handshake import HangUp
from .latency_trace import TRACE
from .writer import ConnectionWriter

log = logging.getLogger(__name__)

RECEIVE_SIZE = 256 * 1024
# How long a closing connection waits: for the client's close-ok, for the writer to finish.
CLOSE_TIMEOUT = 3.0

Stream = trio.SocketStream | trio.SSLStream[trio.SocketStream]


class Session(Protocol):
    """What a ``Transport`` feeds: the AMQP side of its connection (``AMQPConnection``)."""

    @property
    def stats(self) -> ConnectionStats:
        """Counts the bytes and reads received."""
        ...

    @property
    def flow(self) -> PublisherFlow:
        """Waited on before each read (``pause_if_blocked``)."""
        ...

    def started(self) -> None:
        """The nursery is open: start the background tasks (``Transport.start_soon``)."""
        ...

    def receive_deadline(self) -> float:
        """When the client must have sent more (Trio time; ``inf``: no limit)."""
        ...

    def timed_out(self) -> None:
        """The client missed ``receive_deadline``: the connection ends."""
        ...

    async def received(self, data: bytes) -> bool:
        """Handle ``data`` (``b""``: the client's end of stream); False: the connection ends.
        Raises ``HangUp`` to drop the connection without sending what is queued."""
        ...

    def internal_error(self, exc: Exception, where: str) -> None:
        """A bug in ``where``: close the connection (``abort`` if it was closing already)."""
        ...

    async def ended(self) -> None:
        """The connection is over: release what it held (called once, shielded)."""
        ...


class Transport:
    """One connection's stream, writer and tasks, feeding a ``Session`` (``run``)."""

    def __init__(self, stream: Stream, writer: ConnectionWriter, peer: str) -> None:
        self.stream = stream
        self.writer = writer
        self._peer = peer
        # While ``run`` runs (none after it: the session is freed without a cycle to break).
        self._session: Session | None = None
        self._nursery: trio.Nursery | None = None
        self._receive_scope: trio.CancelScope | None = None  # the reader's, while it waits

    async def run(self, session: Session) -> None:
        """Serve ``session`` until the connection ends. Never raises for the peer's mistakes,
        nor for a bug in the connection's tasks (the fault boundary). Cancellation
        propagates."""
        self._session = session
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.writer.run)
                session.started()
                try:
                    await self._read(session)
                except HangUp:
                    self.writer.clear()
                except Exception as exc:
                    # A bug outside the handling of one event: close without waiting for close-ok.
                    session.internal_error(exc, "the reader")
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await self.writer.finish()
                nursery.cancel_scope.cancel()
        except* Exception as group:
            # The writer failed: it may have sent part of a frame, so the connection is dropped.
            log.error("connection %s failed, dropping it", self._peer, exc_info=group)
        finally:
            with trio.CancelScope(shield=True):  # bounded work, paced: see ``Session.ended``
                await session.ended()
            if TRACE is not None:
                TRACE.dump()
            await trio.aclose_forcefully(self.stream)
            self._session = self._nursery = self._receive_scope = None

    async def _read(self, session: Session) -> None:
        """Feed ``session`` what the client sends until the connection ends."""
        stream, writer = self.stream, self.writer
        pause_if_blocked, stats = session.flow.pause_if_blocked, session.stats
        receive_deadline, received = session.receive_deadline, session.received
        while True:
            await pause_if_blocked()  # a resource alarm: publishers wait
            with trio.move_on_at(receive_deadline()) as timeout:
                self._receive_scope = timeout
                try:
                    # The client does not read what we send (returns, get-oks, acks): stop
                    # reading from it until it does, so TCP pushes back on the publisher.
                    await writer.wait_drained()
                    data = bytes(await stream.receive_some(RECEIVE_SIZE))  # TLS: a bytearray
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    log.debug("connection %s lost: %r", self._peer, exc)
                    return
                finally:
                    self._receive_scope = None
            if timeout.cancelled_caught:
                session.timed_out()
                return
            if TRACE is not None:
                TRACE.read()
            stats.recv_oct += len(data)
            stats.recv_cnt += 1
            if not await received(data):
                return

    def start_soon(self, task: Callable[[], Awaitable[None]], where: str) -> None:
        """Run ``task`` beside the reader until the connection ends; an unexpected exception
        in it goes to the session's ``internal_error`` rather than ending the nursery."""
        if self._nursery is not None and self._session is not None:
            self._nursery.start_soon(_guarded, task, where, self._session.internal_error)

    def hurry(self, deadline: float) -> None:
        """The reader, if it is waiting, waits no later than ``deadline``."""
        if self._receive_scope is not None:
            self._receive_scope.deadline = min(self._receive_scope.deadline, deadline)

    def abort(self) -> None:
        """Drop the connection now, with what is queued (``run`` then ends it)."""
        self.writer.clear()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


async def _guarded(
    task: Callable[[], Awaitable[None]],
    where: str,
    internal_error: Callable[[Exception, str], None],
) -> None:
    try:
        await task()
    except Exception as exc:
        internal_error(exc, where)
