"""The HTTP server's limits: how many connections it holds, how long a request head and a
request body may take, and which request paths it reads at all.

Responsibilities:
- ``HttpLimits``: the limits (``http_max_connections``, ``http_idle_timeout``,
  ``http_body_timeout`` in the broker's configuration);
- ``serve``: hypercorn's Trio worker loop (``hypercorn.trio.serve``'s) with a connection cap:
  over ``max_connections`` open HTTP connections (at most a quarter of the descriptor limit per
  port), a new one is answered 503 and closed at once, so that the broker's descriptors stay
  for AMQP;
  hypercorn's ``keep_alive_timeout`` closes a connection that has not sent a complete request
  head within the idle timeout of opening or of its previous response (slow headers, idle
  keep-alive);
- ``BodyDeadline``: an ASGI middleware bounding the wait for a request body (a request that
  has one): it must arrive within ``body_timeout`` seconds, plus one second per
  ``BODY_RATE`` bytes received (a slow but steady upload goes on; a client that sends
  headers and then nothing, or a trickle, is answered 408 and its connection closed); and a
  response sent before the request's body is all in says ``connection: close`` (hypercorn
  closes such a connection after the response, and a client told nothing would send its next
  request on it and find it gone);
- ``ValidPaths``: an ASGI middleware refusing (400) a request path whose percent-encoding is
  malformed or does not decode to UTF-8 text (``%FF``, ``%ED%A0%80``): such names would
  otherwise all decode to U+FFFD and name the same topic.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import resource
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

import attrs
import hypercorn.config
import trio
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, Framework
from hypercorn.utils import repr_socket_addr, wrap_app
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..accepting import serve_listeners

log = logging.getLogger(__name__)

# A body may take one second more per this many bytes received (a floor on the upload rate).
BODY_RATE = 64 * 1024
# The longest request head (request line and headers) hypercorn buffers (its default).
MAX_HEAD_BYTES = 16 * 1024
_OVERLOADED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
# Connections over the cap being answered 503 at once, and how long each may take.
MAX_REFUSING = 100
REFUSAL_SECONDS = 0.5
_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


@attrs.frozen
class HttpLimits:
    max_connections: int = 1000
    idle_timeout: float = 5.0
    body_timeout: float = 30.0


def connection_cap(configured: int) -> int:
    """The cap in effect on one port: ``configured``, but at most a quarter of the process's
    descriptor limit (``RLIMIT_NOFILE``; the HTTP and the metrics port: half in all), so that
    AMQP connections and the stores' files keep the rest."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or configured <= soft // 4:
        return configured
    log.warning(
        "http_max_connections %d lowered to %d: a quarter of the descriptor limit (ulimit -n %d)",
        configured,
        max(1, soft // 4),
        soft,
    )
    return max(1, soft // 4)


def configure(config: hypercorn.config.Config, limits: HttpLimits) -> None:
    """Set hypercorn's own limits from ``limits``."""
    config.keep_alive_timeout = limits.idle_timeout
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.h2_max_header_list_size = MAX_HEAD_BYTES


class _Gate:
    """The count of open connections, against the cap; and of refusals being answered."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refusing = 0
        self.refused = 0

    def enter(self) -> bool:
        if self.open >= self.limit:
            self.refused += 1
            return False
        self.open += 1
        return True


async def serve(
    app: Framework,
    config: hypercorn.config.Config,
    max_connections: int,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` as ``hypercorn.trio.serve`` does (HTTP/1.1 and HTTP/2, TLS if the config
    has a certificate; no lifespan events, no QUIC), holding at most ``max_connections``
    connections; reports the bound URLs (``http://127.0.0.1:15672``) to ``task_status``."""
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)
    sockets = config.create_sockets()
    listeners: list[trio.abc.Listener[Any]] = []
    binds = []
    for sock, scheme in [(s, "https") for s in sockets.secure_sockets] + [
        (s, "http") for s in sockets.insecure_sockets
    ]:
        sock.listen(config.backlog)
        listener: trio.abc.Listener[Any] = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        context_ssl = config.create_ssl_context() if scheme == "https" else None
        if context_ssl is not None:
            listener = trio.SSLListener(listener, context_ssl, https_compatible=True)
        listeners.append(listener)
        binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")
    gate = _Gate(connection_cap(max_connections))

    async def handle(stream: Any) -> None:
        if not gate.enter():
            await _refuse(stream, gate)
            return
        try:
            await TCPServer(wrapped, config, context, ConnectionState({}), stream)
        finally:
            gate.open -= 1

    async with trio.open_nursery() as nursery:
        task_status.started(binds)
        try:
            await serve_listeners(handle, listeners, handler_nursery=nursery, name="HTTP")
        finally:
            await context.terminated.set()


async def _refuse(stream: Any, gate: _Gate) -> None:
    """Answer 503 on a plaintext connection over the cap and close it: the answer is sent,
    then what the client sent is drained for at most ``REFUSAL_SECONDS`` (closing with unread
    data would reset the connection and lose the answer). At most ``MAX_REFUSING`` at a time;
    beyond, and on TLS (a handshake would cost what the cap saves), just closed."""
    if gate.refused == 1 or gate.refused % 1000 == 0:
        log.warning(
            "HTTP connection refused: %d open (http_max_connections); %d refused so far",
            gate.limit,
            gate.refused,
        )
    if isinstance(stream, trio.SSLStream) or gate.refusing >= MAX_REFUSING:
        await trio.aclose_forcefully(stream)
        return
    gate.refusing += 1
    message = json.dumps(
        {"error": "unavailable", "message": f"more than {gate.limit} HTTP connections"}
    ).encode()
    try:
        with trio.move_on_after(REFUSAL_SECONDS), contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(_OVERLOADED % (len(message), message))
            await stream.send_eof()
            while await stream.receive_some(65536):
                pass
    finally:
        gate.refusing -= 1
        await trio.aclose_forcefully(stream)


class BodyDeadline:
    """Bounds the wait for the request body (``HttpLimits.body_timeout``, extended by a second
    per ``BODY_RATE`` bytes): past it the app is told the client went away (it answers 408) and
    the connection is closed."""

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = trio.current_time() + self.timeout
        has_body = any(
            (name == b"content-length" and value.strip() != b"0") or name == b"transfer-encoding"
            for name, value in scope["headers"]
        )
        received = 0
        # A request without a body has nothing to wait for: a response that streams long after
        # the deadline (a read that waited for the read budget) still listens for the client
        # going away, which is not a body that came late.
        complete = not has_body
        body_in = False  # the whole body arrived (not: the wait for it was given up)

        async def bounded() -> Message:
            nonlocal received, complete, body_in
            if complete:  # the body is in: waiting for a disconnect is not bounded
                return await receive()
            with trio.move_on_at(deadline + received / BODY_RATE):
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    complete = body_in = not message.get("more_body", False)
                else:
                    complete = True
                return message
            scope.setdefault("state", {})["tqbroker.body_timeout"] = True
            complete = True
            return {"type": "http.disconnect"}

        async def closing_if_unread(message: Message) -> None:
            if message["type"] == "http.response.start" and has_body and not body_in:
                headers = [
                    (k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"
                ]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, bounded, closing_if_unread)


def body_timed_out(scope: MutableMapping[str, Any]) -> bool:
    """Whether ``BodyDeadline`` gave up on the request's body."""
    return bool(scope.get("state", {}).get("tqbroker.body_timeout"))


def path_problem(raw_path: bytes) -> str | None:
    """What is wrong with a raw request path's percent-encoding, if anything."""
    if _ESCAPE.search(raw_path):
        return "a '%' in the path is not followed by two hex digits"
    try:
        unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return "the path's percent-encoding does not decode to UTF-8 text"
    return None


class ValidPaths:
    """Refuses (400) a request whose path's percent-encoding is malformed or not UTF-8."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
            problem = path_problem(raw.partition(b"?")[0])
            if problem is not None:
                api = scope["path"].startswith("/api/")
                body = {"error": "bad_request", ("reason" if api else "message"): problem}
                data = json.dumps(body).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 400,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": data})
                return
        await self.app(scope, receive, send)
