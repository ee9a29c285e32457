"""The HTTP app and its server: the route table, the broker in ``app.state``, and hypercorn's
Trio worker bound and serving until cancelled (reporting the bound addresses through the Trio
start protocol), over HTTPS with ``tls`` (hypercorn's own TLS: its certfile, keyfile, ca_certs
and verify_mode options; the context from ``server/tls.py``, reloaded in place on SIGHUP).
``GET /health`` is here: it needs no credentials. The Prometheus endpoints are on the metrics
port alone (``serve_metrics``), as RabbitMQ serves them; requests from other sites' pages are
refused in front of every route (``cross_site.py``). In a cluster the ``ClusterNode`` is in
``app.state.cluster`` too (None for a broker on its own: ``cluster_state.py``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import hypercorn.config
import trio
from hypercorn.typing import Framework
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from ...broker.broker import Broker
from ...cluster.node import ClusterNode
from ..registry import Connections
from .cluster_routes import CLUSTER_ROUTES
from .cross_site import CrossSiteGuard
from .definitions_routes import get_definitions, post_definitions
from .errors import EXCEPTION_HANDLERS
from .health_routes import alarms, health, local_alarms
from .limits import BodyDeadline, HttpLimits, ValidPaths, configure, serve
from .metrics_routes import create_metrics_app
from .mgmt_common import RawApiPaths
from .mgmt_routes import MANAGEMENT_ROUTES
from .record_routes import read_records, write_records
from .topic_admin_routes import TOPIC_ADMIN_ROUTES
from .topic_routes import consume, declare_topic, offsets, produce
from .ui import UI_ROUTES

if TYPE_CHECKING:
    from ..tls import ServerTls

log = logging.getLogger(__name__)

Address = tuple[str, int]


MakeApp = Callable[[Broker, Connections, ClusterNode | None], Starlette]


def create_app(
    broker: Broker, connections: Connections, cluster: ClusterNode | None = None
) -> Starlette:
    """The ASGI app serving ``broker`` (and listing ``connections``, its AMQP connections),
    the node ``cluster`` in a cluster (None: on its own)."""
    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/api/health/checks/alarms", alarms),
            Route("/api/health/checks/local-alarms", local_alarms),
            Route("/api/definitions", get_definitions, methods=["GET"]),
            Route("/api/definitions", post_definitions, methods=["POST"]),
            Route("/api/definitions/{vhost}", get_definitions, methods=["GET"]),
            Route("/api/definitions/{vhost}", post_definitions, methods=["POST"]),
            Route("/topics/{topic}", declare_topic, methods=["PUT"]),
            Route("/topics/{topic}/messages", produce, methods=["POST"]),
            Route("/topics/{topic}/messages", consume, methods=["GET"]),
            Route("/topics/{topic}/offsets", offsets),
            Route("/topics/{topic}/records", write_records, methods=["POST"]),
            Route("/topics/{topic}/partitions/{partition}/records", read_records),
            *TOPIC_ADMIN_ROUTES,
            *MANAGEMENT_ROUTES,
            *CLUSTER_ROUTES,
            *UI_ROUTES,  # the web UI: / and /ui/{name}
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[
            Middleware(BodyDeadline, timeout=broker.config.http_body_timeout),
            Middleware(ValidPaths),
            Middleware(CrossSiteGuard),
            Middleware(RawApiPaths),
        ],
    )
    app.state.broker = broker
    app.state.connections = connections
    app.state.cluster = cluster
    return app


async def serve_metrics(
    broker: Broker,
    connections: Connections,
    host: str,
    port: int,
    *,
    tls: ServerTls | None = None,
    cluster: ClusterNode | None = None,
    task_status: trio.TaskStatus[list[Address]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Prometheus endpoints on their own port (``metrics_port``)."""
    await serve_http(
        broker,
        connections,
        host,
        port,
        make_app=create_metrics_app,
        tls=tls,
        cluster=cluster,
        task_status=task_status,
    )


async def serve_http(
    broker: Broker,
    connections: Connections,
    host: str,
    port: int,
    *,
    make_app: MakeApp = create_app,
    tls: ServerTls | None = None,
    cluster: ClusterNode | None = None,
    task_status: trio.TaskStatus[list[Address]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API (or ``make_app``'s, e.g. the metrics port's) on ``host:port`` until
    cancelled, over HTTPS with ``tls``, ``cluster`` the node in a cluster (None: on its own);
    ``nursery.start`` returns the bound addresses."""
    config = _HttpsConfig(tls) if tls is not None else hypercorn.config.Config()
    config.ssl_handshake_timeout = broker.config.handshake_timeout  # as on the amqps port
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    # The access log (``http_access_log``, off by default): a logger of ours, so it goes where
    # and how the broker logs (logsetup.py); hypercorn's atoms, never a credential header.
    if broker.config.http_access_log:
        config.accesslog = logging.getLogger("tqbroker.http.access")
        config.accesslog.addFilter(_responded)
        config.access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(L)ss "%(a)s"'
    else:
        config.accesslog = None
    config.errorlog = log
    config.include_server_header = False
    limits = HttpLimits(
        broker.config.http_max_connections,
        broker.config.http_idle_timeout,
        broker.config.http_body_timeout,
    )
    configure(config, limits)

    async def started(*, task_status: trio.TaskStatus[list[str]]) -> None:
        made = make_app(broker, connections, cluster)
        app = cast(Framework, made)  # hypercorn's types: any ASGI app
        await serve(app, config, limits.max_connections, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(started)
        task_status.started([_address(bind) for bind in binds])


class _HttpsConfig(hypercorn.config.Config):
    """Hypercorn's TLS options from ``[tls]``; its context is ``ServerTls``'s (reloadable)."""

    def __init__(self, tls: ServerTls) -> None:
        super().__init__()
        self.server_tls = tls
        options = tls.config
        self.certfile, self.keyfile = str(options.certfile), str(options.keyfile)
        self.ca_certs = str(options.cacertfile) if options.cacertfile else None
        if options.verify_peer:
            self.verify_mode = (
                ssl.CERT_REQUIRED if options.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
            )

    def create_ssl_context(self) -> ssl.SSLContext:
        return self.server_tls.http_context(self.alpn_protocols)


def _address(bind: str) -> Address:
    """``("127.0.0.1", 15672)`` from hypercorn's ``http://127.0.0.1:15672`` (or https)."""
    host, _, port = bind.partition("://")[2].rpartition(":")
    return host.strip("[]"), int(port)


def _responded(record: logging.LogRecord) -> bool:
    """Drop hypercorn's second line for a request whose client closed the stream (status
    ``-``, logged besides the real one, sometimes before it); give the others their fields
    (``peer``, ``method``, ``path``, ``status``, ``duration_s``: keys in JSON logs)."""
    atoms = record.args
    if not isinstance(atoms, dict) or atoms.get("s") == "-":
        return False
    record.peer, record.method, record.path = atoms.get("h"), atoms.get("m"), atoms.get("U")
    record.status = int(atoms["s"]) if str(atoms.get("s")).isdigit() else None
    record.duration_s = round(float(atoms.get("L") or 0), 6)
    return True
