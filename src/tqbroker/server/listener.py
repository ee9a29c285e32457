"""``serve``: run a broker, its AMQP listener and its HTTP API in the caller's nursery.

Responsibilities:
- start the broker (queue actors), and in a cluster its node (``clustering.py``: caught up
  with the cluster before any listener opens), bind the AMQP listeners (plaintext, and amqps when
  ``[tls]`` has a certificate: ``tls.py``; ``tls.only`` leaves out the plaintext one) and start
  the HTTP API (``server/http/``; HTTPS with ``tls.http``), the Kafka listener
  (``kafka_port``) and, with a ``[tls]`` certificate, the Kafka TLS one (``kafka_tls_port``;
  its handshake as amqps', with the same contexts), then report the bound addresses
  (``Listening``) through the Trio start protocol;
- at most ``max_pending_handshakes_per_address`` connections per source address in their
  handshake (``admission.py``; amqps ones from before their TLS handshake); more are closed at
  once;
- amqps: the TLS handshake within the connection's ``handshake_timeout`` (counted from the
  accept); a failed or late one is one log line and a closed socket;
- the accept loops (``accepting.py``: out of descriptors, a warning line every 10 s, no
  traceback);
- a nursery per connection, under a handler nursery owned here; a connection that fails
  (a bug its own boundary did not contain) is logged and closed, and ``serve`` goes on;
- graceful shutdown when ``shutdown`` is set: stop accepting, in a cluster leave it (leaders
  move first: ``ClusterNode.leave``), ask every client to leave
  (``connection.close`` 320), give them ``shutdown_timeout`` seconds, then cut what remains.
  Cancelling ``serve`` instead stops everything at once.
"""

from __future__ import annotations

import functools
import logging
import socket

import attrs
import trio

from ..broker.broker import Broker
from ..config import BrokerConfig
from ..storage_env import StorageEnv
from .accepting import serve_listeners
from .addresses import peer_address, text
from .admission import HandshakeAdmission, Ticket
from .clustering import advertise, cluster_node, run_node
from .connection import AMQPConnection
from .http import serve_http, serve_metrics
from .http.mgmt_overview import node_stats
from .kafka import KafkaService
from .registry import Connections
from .tls import ServerTls

log = logging.getLogger(__name__)

Address = tuple[str, int]


@attrs.frozen
class Listening:
    """Where a running broker listens: AMQP, HTTP and Prometheus metrics ``(host, port)``
    addresses (none for HTTP or metrics when ``http_port`` or ``metrics_port`` is None; none
    for AMQP with ``tls.only``), amqps ones (with a ``[tls]`` certificate), and the broker and
    its TLS contexts (``tls.reload()`` on SIGHUP)."""

    amqp: list[Address]
    http: list[Address]
    metrics: list[Address] = attrs.field(factory=list)
    broker: Broker | None = attrs.field(default=None, eq=False, repr=False)
    amqps: list[Address] = attrs.field(factory=list)
    tls: ServerTls | None = attrs.field(default=None, eq=False, repr=False)
    kafka: list[Address] = attrs.field(factory=list)
    kafka_tls: list[Address] = attrs.field(factory=list)


async def serve(
    config: BrokerConfig | None = None,
    *,
    shutdown: trio.Event | None = None,
    env: StorageEnv | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker until cancelled, or until ``shutdown`` is set (then shut down gracefully);
    its storage works through ``env`` (None: the real file system).

    ``await nursery.start(serve, config)`` returns where it listens (``Listening``).
    """
    config = config or BrokerConfig()
    tls = ServerTls(config.tls) if config.tls.enabled else None  # TlsError: a bad file
    http_tls = tls if config.tls.http else None
    https = "https" if http_tls is not None else "http"
    broker = Broker(config, env)
    node = cluster_node(broker, config)  # before the broker opens its streams
    connections = Connections()
    if node is not None:  # what the other nodes' /api/nodes show of this one
        node.stats = functools.partial(node_stats, broker, connections)
    all_closed = trio.Event()
    async with trio.open_nursery() as broker_nursery:
        await broker_nursery.start(broker.run)
        if node is not None:  # clients only once the node has caught up with the cluster
            await broker_nursery.start(run_node, node)
        listeners: list[trio.SocketListener] = []
        if not config.tls.only:
            listeners = await open_listeners(config.port, config.host)
        tls_listeners: list[trio.SocketListener] = []
        if tls is not None:
            tls_listeners = await open_listeners(config.tls.port, config.host)
        kafka_listeners: list[trio.SocketListener] = []
        if config.kafka_port is not None:
            kafka_listeners = await open_listeners(config.kafka_port, config.host)
        kafka_tls_listeners: list[trio.SocketListener] = []
        if tls is not None and config.kafka_tls_port is not None:
            kafka_tls_listeners = await open_listeners(config.kafka_tls_port, config.host)
        addresses, tls_addresses = _bound(listeners), _bound(tls_listeners)
        kafka_addresses, kafka_tls_addresses = _bound(kafka_listeners), _bound(kafka_tls_listeners)
        kafka = KafkaService(broker, node)
        if kafka_listeners or kafka_tls_listeners:
            await broker_nursery.start(kafka.run)
        for host, port in kafka_addresses:
            log.info("tqbroker listening for Kafka clients on %s:%d", host, port)
        for host, port in kafka_tls_addresses:
            log.info("tqbroker listening for Kafka clients over TLS on %s:%d", host, port)
        for host, port in addresses:
            log.info("tqbroker %s listening for AMQP on %s:%d", broker.config.host, host, port)
        for host, port in tls_addresses:
            log.info("tqbroker listening for AMQP over TLS on %s:%d", host, port)
        connections.listeners += [("amqp", host, port) for host, port in addresses]
        connections.listeners += [("amqp/ssl", host, port) for host, port in tls_addresses]
        connections.listeners += [("kafka", host, port) for host, port in kafka_addresses]
        connections.listeners += [("kafka/ssl", host, port) for host, port in kafka_tls_addresses]
        http: list[Address] = []
        if config.http_port is not None:
            http = await broker_nursery.start(
                functools.partial(
                    serve_http,
                    broker,
                    connections,
                    config.host,
                    config.http_port,
                    tls=http_tls,
                    cluster=node,
                )
            )
            connections.listeners += [(https, host, port) for host, port in http]
        metrics: list[Address] = []
        if config.metrics_port is not None and config.metrics_port >= 0:
            metrics = await broker_nursery.start(
                functools.partial(
                    serve_metrics,
                    broker,
                    connections,
                    config.host,
                    config.metrics_port,
                    tls=http_tls,
                    cluster=node,
                )
            )
            connections.listeners += [(f"{https}/prometheus", h, p) for h, p in metrics]

        if node is not None:
            advertise(node, config, addresses or tls_addresses, http, kafka_addresses)
        admission = HandshakeAdmission(config.max_pending_handshakes_per_address)

        async def accept_tls(
            stream: trio.SocketStream,
        ) -> tuple[trio.SSLStream[trio.SocketStream], str | None, Ticket, float] | None:
            """The TLS handshake of an accepted connection (amqps, Kafka's TLS port) under the
            admission limit: the TLS stream, its certificate's user, its admission ticket and
            its handshake deadline; None (the socket closed) if it failed."""
            assert tls is not None
            peer = peer_address(stream.socket)
            ticket = admission.admit(peer[0])
            if ticket is None:  # too many connections from there are in their handshake
                await trio.aclose_forcefully(stream)
                return None
            deadline = trio.current_time() + config.handshake_timeout
            try:
                accepted = await tls.accept(stream, deadline, text(peer))
            except Exception:  # a bug: this connection alone fails, never ``serve``
                log.exception("TLS connection from %s failed", text(peer))
                await trio.aclose_forcefully(stream)
                accepted = None
            if accepted is None:
                ticket.release()
                return None
            return accepted[0], accepted[1], ticket, deadline

        async def handle_tls(stream: trio.SocketStream) -> None:
            accepted = await accept_tls(stream)
            if accepted is not None:
                tls_stream, username, ticket, deadline = accepted
                await handle(tls_stream, ticket, peer_username=username, deadline=deadline)

        async def handle_kafka_tls(stream: trio.SocketStream) -> None:
            accepted = await accept_tls(stream)
            if accepted is not None:
                tls_stream, username, ticket, _deadline = accepted
                ticket.release()  # a Kafka connection's handshake is its TLS one
                await kafka.handle(tls_stream, username)

        async def handle_plain(stream: trio.SocketStream) -> None:
            ticket = admission.admit(peer_address(stream.socket)[0])
            if ticket is None:  # too many connections from there are in their handshake
                await trio.aclose_forcefully(stream)
                return
            await handle(stream, ticket)

        async def handle(
            stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
            ticket: Ticket,
            peer_username: str | None = None,
            deadline: float | None = None,
        ) -> None:
            connection = AMQPConnection(
                broker,
                stream,
                on_open=ticket.release,
                peer_username=peer_username,
                deadline=deadline,
            )
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
                for handler, bound, name in (
                    (handle_plain, listeners, "AMQP"),
                    (handle_tls, tls_listeners, "amqps"),
                    (kafka.handle, kafka_listeners, "Kafka"),
                    (handle_kafka_tls, kafka_tls_listeners, "Kafka TLS"),
                ):
                    if bound:
                        serving = functools.partial(
                            serve_listeners,
                            handler,
                            bound,
                            handler_nursery=handler_nursery,
                            name=name,
                        )
                        accept_nursery.start_soon(serving)
                task_status.started(
                    Listening(
                        addresses,
                        http,
                        metrics,
                        broker,
                        tls_addresses,
                        tls,
                        kafka_addresses,
                        kafka_tls_addresses,
                    )
                )
                if shutdown is None:
                    await trio.sleep_forever()
                await shutdown.wait()
                accept_nursery.cancel_scope.cancel()
            if node is not None:  # its partitions led elsewhere before its clients go
                await node.leave()
            log.info("shutting down: closing %d connection(s)", len(connections))
            for entry in connections:
                entry.connection.shutdown()
            handler_nursery.cancel_scope.deadline = trio.current_time() + config.shutdown_timeout
            if connections:
                await all_closed.wait()
            handler_nursery.cancel_scope.cancel()
        broker_nursery.cancel_scope.cancel()


async def open_listeners(port: int, host: str) -> list[trio.SocketListener]:
    """Listening sockets on ``host:port``. ``::`` is dual-stack (IPv4 clients too, as
    RabbitMQ's and hypercorn's listeners on ``::`` are); trio would make it IPv6-only."""
    if host != "::" or not socket.has_dualstack_ipv6():
        return await trio.open_tcp_listeners(port, host=host)
    sock = trio.socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        await sock.bind(("::", port))
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return [trio.SocketListener(sock)]


def _bound(listeners: list[trio.SocketListener]) -> list[Address]:
    return [
        (sockname[0], sockname[1])
        for sockname in (listener.socket.getsockname() for listener in listeners)
    ]
