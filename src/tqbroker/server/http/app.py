"""The HTTP app and its server: the route table, the broker in ``app.state``, and hypercorn's
Trio worker bound and serving until cancelled (reporting the bound addresses through the Trio
start protocol). ``GET /health`` is here: it needs no credentials.
"""

from __future__ import annotations

import logging
from typing import cast

import hypercorn.config
import hypercorn.trio
import trio
from hypercorn.typing import Framework
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from ...broker.broker import Broker
from ..registry import Connections
from .errors import EXCEPTION_HANDLERS
from .health_routes import alarms, health, local_alarms
from .mgmt_common import RawApiPaths
from .mgmt_routes import MANAGEMENT_ROUTES
from .record_routes import read_records, write_records
from .topic_admin_routes import TOPIC_ADMIN_ROUTES
from .topic_routes import consume, declare_topic, offsets, produce
from .ui import UI_ROUTES

log = logging.getLogger(__name__)

Address = tuple[str, int]


def create_app(broker: Broker, connections: Connections | None = None) -> Starlette:
    """The ASGI app serving ``broker`` (and listing ``connections``, its AMQP connections)."""
    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/api/health/checks/alarms", alarms),
            Route("/api/health/checks/local-alarms", local_alarms),
            Route("/topics/{topic}", declare_topic, methods=["PUT"]),
            Route("/topics/{topic}/messages", produce, methods=["POST"]),
            Route("/topics/{topic}/messages", consume, methods=["GET"]),
            Route("/topics/{topic}/offsets", offsets),
            Route("/topics/{topic}/records", write_records, methods=["POST"]),
            Route("/topics/{topic}/partitions/{partition}/records", read_records),
            *TOPIC_ADMIN_ROUTES,
            *MANAGEMENT_ROUTES,
            *UI_ROUTES,  # the web UI: / and /ui/{name}
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[Middleware(RawApiPaths)],
    )
    app.state.broker = broker
    app.state.connections = connections if connections is not None else Connections()
    return app


async def serve_http(
    broker: Broker,
    connections: Connections,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[Address]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API on ``host:port`` until cancelled; ``nursery.start`` returns the bound
    addresses."""
    config = hypercorn.config.Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.include_server_header = False

    async def started(*, task_status: trio.TaskStatus[list[str]]) -> None:
        app = cast(
            Framework, create_app(broker, connections)
        )  # an ASGI app hypercorn's types don't know
        await hypercorn.trio.serve(app, config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(started)
        task_status.started([_address(bind) for bind in binds])


def _address(bind: str) -> Address:
    """``("127.0.0.1", 15672)`` from hypercorn's ``http://127.0.0.1:15672``."""
    host, _, port = bind.removeprefix("http://").rpartition(":")
    return host.strip("[]"), int(port)
