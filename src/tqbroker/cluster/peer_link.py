"""The node-to-node link over Trio streams: the I/O around ``peer_protocol.PeerConnection``
(§4.6 of ``shared/reference/scaleout.md``). A node holds one ``PeerClient`` per other node (its
one connection to that node, for follower fetches and forwarded publishes) and serves the
other nodes' clients with one ``PeerServer``.

Responsibilities:
- ``PeerServer.serve_stream``: one connection from another node: the handshake (within
  ``handshake_timeout``), then its requests, run concurrently (at most ``max_in_flight`` at a
  time: past that the server stops reading, and TCP pushes back) with each reply tagged by its
  request's id; a handler's exception becomes an error reply (``PeerError`` raised by a handler
  chooses its code) and the connection carries on. A protocol error, a failed handshake or a
  broken stream closes that connection only;
- ``PeerClient``: connects on the first request, multiplexes every concurrent ``request`` on
  that connection and reconnects on the next request once it is lost. Requests fail fast
  while a failed connect is backing off (gRPC's default, rather than waiting): ``PeerUnavailable``
  then, and for the requests in flight when a connection is lost; ``PeerError`` when the other
  node's handler failed; ``PeerTimeout`` after the request's timeout. A timeout on a connection
  that sent nothing at all meanwhile drops that connection (a dead peer behind a silent TCP
  connection: the next request connects again);
- ``connect_tcp`` and ``serve_tcp``: the link over TCP.

A client's connection is read and written by a Trio system task (the client, like a pool of
connections, belongs to no nursery); ``aclose`` ends it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import trio

from .peer_protocol import (
    DEFAULT_MAX_FRAME,
    EndOfStream,
    ErrorReply,
    Event,
    HandshakeComplete,
    LocalProtocolError,
    PeerConnection,
    PeerProtocolError,
    Reply,
    Request,
    Role,
    State,
)

log = logging.getLogger(__name__)

Handler = Callable[[str, str, Any], Awaitable[Any]]  # (peer node id, op, body) -> reply body
Connect = Callable[[], Awaitable[trio.abc.Stream]]

HANDLER_FAILED: Final = "handler_failed"  # the code of an error reply for an unexpected exception
RECEIVE_BYTES: Final = 256 * 1024
WRITE_BATCH_BYTES: Final = 256 * 1024  # frames queued together go out in one write up to this
MAX_ERROR_TEXT: Final = 1000

_STREAM_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError)


@attrs.frozen
class LinkSettings:
    max_frame: int = DEFAULT_MAX_FRAME  # bytes of one frame's body, either way
    handshake_timeout: float = 5.0  # seconds to connect and authenticate
    request_timeout: float = 30.0  # a request's default timeout
    max_in_flight: int = 256  # requests at a time on one connection (each side enforces it)
    reconnect_initial: float = 0.1  # seconds after the first failed connect
    reconnect_max: float = 5.0  # the backoff doubles up to this

    def backoff(self, failures: int) -> float:
        return float(min(self.reconnect_max, self.reconnect_initial * 2 ** (failures - 1)))


class PeerLinkError(Exception):
    """A request over the link failed."""


class PeerError(PeerLinkError):
    """The other node's handler failed: its code and text (a handler raises it to choose the
    code of its error reply)."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text


class PeerUnavailable(PeerLinkError):
    """No connection to the other node: it cannot be reached or authenticated, or the
    connection was lost with the request in flight."""


class PeerTimeout(PeerLinkError):
    """No reply within the request's timeout."""


class PeerServer:
    """Serves other nodes' requests with ``handler`` (see the module doc)."""

    def __init__(
        self,
        node_id: str,
        secret: bytes,
        handler: Handler,
        settings: LinkSettings = LinkSettings(),
    ) -> None:
        self.node_id = node_id
        self.handler = handler
        self.settings = settings
        self._secret = secret

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serves one connection until it ends; never raises for the connection's sake."""
        connection = PeerConnection(
            Role.ACCEPTOR, self.node_id, self._secret, max_frame=self.settings.max_frame
        )
        async with stream:
            try:
                with trio.fail_after(self.settings.handshake_timeout):
                    events = await _handshake(stream, connection)
            except (PeerProtocolError, trio.TooSlowError, *_STREAM_ERRORS) as exc:
                log.warning("peer link from node %r refused: %s", connection.peer_id, _why(exc))
                return
            peer_id = connection.peer_id
            assert peer_id is not None
            frames_in, frames_out = trio.open_memory_channel[bytes](math.inf)
            in_flight = trio.Semaphore(self.settings.max_in_flight)

            async with trio.open_nursery() as handlers:

                async def dispatch(event: Event) -> None:
                    assert isinstance(event, Request)  # all an acceptor receives once open
                    await in_flight.acquire()
                    handlers.start_soon(
                        self._answer, connection, peer_id, event, frames_in, in_flight
                    )

                why = await _run_link(stream, connection, frames_out, dispatch, events)
                handlers.cancel_scope.cancel()
            log.info("peer link from node %r closed: %s", peer_id, why)

    async def _answer(
        self,
        connection: PeerConnection,
        peer_id: str,
        request: Request,
        frames: trio.MemorySendChannel[bytes],
        in_flight: trio.Semaphore,
    ) -> None:
        try:
            error: tuple[str, str] | None = None
            try:
                body = await self.handler(peer_id, request.op, request.body)
            except PeerError as exc:
                error = (exc.code, exc.text)
            except Exception as exc:
                log.error("peer %r: %s failed", peer_id, request.op, exc_info=True)
                error = (HANDLER_FAILED, f"{type(exc).__name__}: {exc}")
            if connection.state is not State.OPEN:  # the link closed while the handler ran
                log.info("peer %r: the link closed before %s's answer", peer_id, request.op)
                return
            if error is None:
                try:
                    frames.send_nowait(connection.send_reply(request.id, body))
                    return
                except LocalProtocolError as exc:  # the reply is over the frame limit
                    error = (HANDLER_FAILED, f"LocalProtocolError: {exc}")
            code, text = error
            frames.send_nowait(connection.send_error(request.id, code, text[:MAX_ERROR_TEXT]))
        finally:
            in_flight.release()


class PeerClient(trio.abc.AsyncResource):
    """This node's connection to node ``peer_id``, reached with ``connect`` (see the module
    doc)."""

    def __init__(
        self,
        node_id: str,
        secret: bytes,
        connect: Connect,
        *,
        peer_id: str,
        settings: LinkSettings = LinkSettings(),
    ) -> None:
        self.node_id = node_id
        self.peer_id = peer_id
        self.settings = settings
        self._secret = secret
        self._connect_stream = connect
        self._link: _Link | None = None
        self._connect_lock = trio.Lock()
        self._slots = trio.Semaphore(settings.max_in_flight)
        self._attempts = 0
        self._failures = 0  # connect attempts failed in a row
        self._last_failure = ""
        self._retry_at = -math.inf
        self._closed = False

    async def request(
        self,
        op: str,
        body: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  (also tells a silent connection)
    ) -> Any:
        """The other node's reply to ``op`` with ``body`` (CBOR-encodable values), within
        ``timeout`` seconds (the settings' ``request_timeout`` if None), connecting first if
        need be."""
        if timeout is None:
            timeout = self.settings.request_timeout
        link, heard = None, 0
        with trio.move_on_after(timeout):
            async with self._slots:
                link = await self._open_link()
                heard = link.frames_received
                return await link.call(op, body)
        if link is not None and link.frames_received == heard:
            link.lose(f"node {self.peer_id!r} sent nothing for {timeout} s")
        raise PeerTimeout(f"no reply from node {self.peer_id!r} to {op!r} within {timeout} s")

    async def aclose(self) -> None:
        """Closes the connection (its requests in flight fail with ``PeerUnavailable``), and
        refuses further requests."""
        self._closed = True
        if self._link is not None:
            self._link.lose("the client was closed")
            await self._link.finished.wait()
        await trio.lowlevel.checkpoint()

    async def _open_link(self) -> _Link:
        if self._link is not None and self._link.alive:
            return self._link
        attempts = self._attempts
        async with self._connect_lock:
            if self._closed:
                raise PeerUnavailable(f"the client of node {self.peer_id!r} is closed")
            if self._link is not None and self._link.alive:
                return self._link
            if self._attempts != attempts and self._failures:
                raise PeerUnavailable(self._last_failure)  # the attempt this request awaited
            wait = self._retry_at - trio.current_time()
            if wait > 0:
                raise PeerUnavailable(f"{self._last_failure} (next attempt in {wait:.2f} s)")
            self._attempts += 1
            try:
                link = await self._connect()
            except PeerUnavailable as exc:
                self._failures += 1
                self._last_failure = str(exc)
                self._retry_at = trio.current_time() + self.settings.backoff(self._failures)
                raise
            self._failures = 0
            self._link = link
            if self._closed:  # while it connected
                link.lose("the client was closed")
            return link

    async def _connect(self) -> _Link:
        peer = f"node {self.peer_id!r}"
        connection = PeerConnection(
            Role.INITIATOR,
            self.node_id,
            self._secret,
            expected_peer=self.peer_id,
            max_frame=self.settings.max_frame,
        )
        try:
            with trio.fail_after(self.settings.handshake_timeout):
                stream = await self._connect_stream()
                try:
                    events = await _handshake(stream, connection)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except trio.TooSlowError:
            raise PeerUnavailable(
                f"no connection to {peer} within {self.settings.handshake_timeout} s"
            ) from None
        except OSError as exc:
            raise PeerUnavailable(f"cannot connect to {peer}: {exc}") from exc
        except (PeerProtocolError, *_STREAM_ERRORS) as exc:
            raise PeerUnavailable(f"handshake with {peer} failed: {_why(exc)}") from exc
        link = _Link(peer, stream, connection)
        trio.lowlevel.spawn_system_task(link.run, events, name=f"peer link to {peer}")
        return link


@attrs.define
class _Call:
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: Reply | ErrorReply | None = None
    lost: str = ""

    def result(self) -> Any:
        if isinstance(self.answer, Reply):
            return self.answer.body
        if isinstance(self.answer, ErrorReply):
            raise PeerError(self.answer.code, self.answer.text)
        raise PeerUnavailable(self.lost)


class _Link:
    """One authenticated connection of a client: its requests awaiting replies."""

    def __init__(self, peer: str, stream: trio.abc.Stream, connection: PeerConnection) -> None:
        self.peer = peer
        self.stream = stream
        self.connection = connection
        self.frames_received = 0
        self.finished = trio.Event()
        self._lost = ""
        self._calls: dict[int, _Call] = {}
        self._next_id = 0
        self._frames_in, self._frames_out = trio.open_memory_channel[bytes](math.inf)
        self._cancel = trio.CancelScope()

    @property
    def alive(self) -> bool:
        return not self._lost and self.connection.state is State.OPEN

    async def call(self, op: str, body: Any) -> Any:
        if not self.alive:
            raise PeerUnavailable(self._lost or f"the connection to {self.peer} is closing")
        request_id = self._next_id
        frame = self.connection.send_request(request_id, op, body)
        self._next_id += 1
        call = self._calls[request_id] = _Call()
        self._frames_in.send_nowait(frame)
        try:
            await call.done.wait()
        finally:
            self._calls.pop(request_id, None)
        return call.result()

    def lose(self, why: str) -> None:
        """Ends the connection: the requests in flight fail with ``why``."""
        if self._lost:
            return
        self._lost = why
        log.info("peer link to %s lost: %s", self.peer, why)
        for call in self._calls.values():
            call.lost = why
            call.done.set()
        self._calls.clear()
        self._cancel.cancel()

    async def run(self, events: list[Event]) -> None:
        try:
            with self._cancel:
                why = await _run_link(
                    self.stream, self.connection, self._frames_out, self._dispatch, events
                )
                self.lose(f"{self.peer}: {why}")
        except Exception:  # a system task must not raise: it would end the whole Trio run
            log.exception("peer link to %s failed", self.peer)
            self.lose(f"the connection to {self.peer} failed")
        finally:
            await trio.aclose_forcefully(self.stream)
            self.finished.set()

    async def _dispatch(self, event: Event) -> None:
        assert isinstance(event, Reply | ErrorReply)  # all an initiator receives once open
        self.frames_received += 1
        call = self._calls.pop(event.id, None)
        if call is not None:  # else the request timed out and was forgotten
            call.answer = event
            call.done.set()


async def _handshake(stream: trio.abc.Stream, connection: PeerConnection) -> list[Event]:
    """Authenticates the connection; returns the events that followed the handshake in the
    same read."""
    while True:
        if data := connection.data_to_send():
            await stream.send_all(data)
        events = connection.receive_data(await stream.receive_some(RECEIVE_BYTES))
        if not events:
            continue
        if not isinstance(events[0], HandshakeComplete):
            raise PeerProtocolError("the peer closed the connection during the handshake")
        if data := connection.data_to_send():  # the initiator's proof
            await stream.send_all(data)
        return events[1:]


async def _run_link(
    stream: trio.abc.Stream,
    connection: PeerConnection,
    frames: trio.MemoryReceiveChannel[bytes],
    dispatch: Callable[[Event], Awaitable[None]],
    events: list[Event],
) -> str:
    """Writes ``frames`` and dispatches what arrives (first ``events``) until the connection
    ends; returns why it ended."""
    why = "cancelled"
    async with trio.open_nursery() as nursery:

        async def write() -> None:
            nonlocal why
            try:
                await _write_frames(stream, frames)
            except _STREAM_ERRORS as exc:
                why = _why(exc)
                nursery.cancel_scope.cancel()

        nursery.start_soon(write)
        try:
            while True:
                for event in events:
                    if isinstance(event, EndOfStream):
                        why = "the peer closed the connection"
                        return why
                    await dispatch(event)
                events = connection.receive_data(await stream.receive_some(RECEIVE_BYTES))
        except (PeerProtocolError, *_STREAM_ERRORS) as exc:
            why = _why(exc)
        finally:
            nursery.cancel_scope.cancel()
    return why


async def _write_frames(stream: trio.abc.Stream, frames: trio.MemoryReceiveChannel[bytes]) -> None:
    """Sends the frames as they are queued, those queued together in one write."""
    async for frame in frames:
        batch, size = [frame], len(frame)
        while size < WRITE_BATCH_BYTES:
            try:
                frame = frames.receive_nowait()
            except trio.WouldBlock:
                break
            batch.append(frame)
            size += len(frame)
        await stream.send_all(batch[0] if len(batch) == 1 else b"".join(batch))


def _why(exc: BaseException) -> str:
    if isinstance(exc, PeerProtocolError):
        return f"protocol error: {exc}"
    if isinstance(exc, trio.TooSlowError):
        return "the handshake timed out"
    return f"the connection broke ({type(exc).__name__}: {exc})"


def connect_tcp(host: str, port: int) -> Connect:
    """A ``connect`` for ``PeerClient``: a TCP connection to ``host:port``."""

    async def connect() -> trio.abc.Stream:
        return await trio.open_tcp_stream(host, port)

    return connect


async def serve_tcp(
    server: PeerServer,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves the link on ``host:port`` (port 0: any free port); ``task_status.started``
    reports the port bound."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(server.serve_stream, listeners)
