"""``serve``: run a broker, its AMQP listener and its HTTP API in the caller's nursery.

Responsibilities:
- start the broker (queue actors), bind the AMQP listeners and start the HTTP API
  (``server/http/``), then report the bound addresses (``Listening``) through the Trio start
  protocol;
- at most ``max_pending_handshakes_per_address`` connections per source address in their
  handshake (``admission.py``); more are closed at once;
- a nursery per connection, under a handler nursery owned here; a connection that fails
  (a bug its own boundary did not contain) is logged and closed, and ``serve`` goes on;
- graceful shutdown when ``shutdown`` is set: stop accepting, ask every client to leave
  (``connection.close`` 320), give them ``shutdown_timeout`` seconds, then cut what remains.
  Cancelling ``serve`` instead stops everything at once.
"""

from __future__ import annotations

import functools
import logging

import attrs
import trio

from ..broker.broker import Broker
from ..config import BrokerConfig
from .admission import HandshakeAdmission
from .connection import AMQPConnection
from .http import serve_http, serve_metrics
from .registry import Connections

log = logging.getLogger(__name__)

Address = tuple[str, int]


@attrs.frozen
class Listening:
    """Where a running broker listens: AMQP, HTTP and Prometheus metrics ``(host, port)``
    addresses (none for HTTP or metrics when ``http_port`` or ``metrics_port`` is None), and
    the broker (for embedding code and tests)."""

    amqp: list[Address]
    http: list[Address]
    metrics: list[Address] = attrs.field(factory=list)
    broker: Broker | None = attrs.field(default=None, eq=False, repr=False)


async def serve(
    config: BrokerConfig | None = None,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker until cancelled, or until ``shutdown`` is set (then shut down gracefully).

    ``await nursery.start(serve, config)`` returns where it listens (``Listening``).
    """
    config = config or BrokerConfig()
    broker = Broker(config)
    connections = Connections()
    all_closed = trio.Event()
    async with trio.open_nursery() as broker_nursery:
        await broker_nursery.start(broker.run)
        listeners = await trio.open_tcp_listeners(config.port, host=config.host)
        addresses: list[Address] = [
            (sockname[0], sockname[1])
            for sockname in (listener.socket.getsockname() for listener in listeners)
        ]
        for host, port in addresses:
            log.info("tqbroker %s listening for AMQP on %s:%d", broker.config.host, host, port)
        connections.listeners += [("amqp", host, port) for host, port in addresses]
        http: list[Address] = []
        if config.http_port is not None:
            http = await broker_nursery.start(
                serve_http, broker, connections, config.host, config.http_port
            )
            connections.listeners += [("http", host, port) for host, port in http]
        metrics: list[Address] = []
        if config.metrics_port is not None and config.metrics_port >= 0:
            metrics = await broker_nursery.start(
                serve_metrics, broker, connections, config.host, config.metrics_port
            )
            connections.listeners += [("http/prometheus", host, port) for host, port in metrics]

        admission = HandshakeAdmission(config.max_pending_handshakes_per_address)

        async def handle(stream: trio.SocketStream) -> None:
            ticket = admission.admit(_peer_host(stream))
            if ticket is None:  # too many connections from there are in their handshake
                await trio.aclose_forcefully(stream)
                return
            connection = AMQPConnection(broker, stream, on_open=ticket.release)
            connections.add(connection)
            try:
                await connection.run()
            except* Exception as group:
                # The last line of defence: one connection's failure never ends ``serve``.
                log.error("connection %s failed", connection.peer, exc_info=group)
                await trio.aclose_forcefully(stream)
            finally:
                ticket.release()
                connections.discard(connection)
                if not connections and shutdown is not None and shutdown.is_set():
                    all_closed.set()

        async with trio.open_nursery() as handler_nursery:
            async with trio.open_nursery() as accept_nursery:
                accept_nursery.start_soon(
                    functools.partial(
                        trio.serve_listeners, handle, listeners, handler_nursery=handler_nursery
                    )
                )
                task_status.started(Listening(addresses, http, metrics, broker))
                if shutdown is None:
                    await trio.sleep_forever()
                await shutdown.wait()
                accept_nursery.cancel_scope.cancel()
            log.info("shutting down: closing %d connection(s)", len(connections))
            for entry in connections:
                entry.connection.shutdown()
            handler_nursery.cancel_scope.deadline = trio.current_time() + config.shutdown_timeout
            if connections:
                await all_closed.wait()
            handler_nursery.cancel_scope.cancel()
        broker_nursery.cancel_scope.cancel()


def _peer_host(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError):
        return "unknown"
