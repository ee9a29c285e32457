"""Prometheus' HTTP endpoints, as RabbitMQ's ``rabbitmq_prometheus`` serves them: ``/metrics``
(queue figures summed), ``/metrics/per-object`` (per queue), ``/metrics/detailed?family=...``
(``&vhost=...``); on the HTTP API's port and on their own (``metrics_port``, 15692 as
RabbitMQ's; ``serve_metrics``). No credentials, as RabbitMQ's.

A scrape reads the broker on the event loop, giving way between queues (``collect_async``);
a large exposition (10k queues) is rendered in a worker thread from the families read, so the
loop is never held for long.
"""

from __future__ import annotations

from collections.abc import Iterator

import prometheus_client
import trio
from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...broker.broker import Broker
from .metrics import collect_async

# Past this many samples the text is rendered in a worker thread.
THREAD_RENDER_SAMPLES = 2000
CONTENT_TYPE = prometheus_client.exposition.CONTENT_TYPE_PLAIN_0_0_4


class _Fixed(CollectorRegistry):
    """Families already collected, as the registry ``generate_latest`` renders."""

    def __init__(self, families: list[Metric]) -> None:
        super().__init__(auto_describe=False)
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: list[Metric]) -> bytes:
    """The text exposition format (0.0.4, as RabbitMQ serves it)."""
    return prometheus_client.generate_latest(_Fixed(families))


def sample_count(families: list[Metric]) -> int:
    return sum(len(family.samples) for family in families)


async def _respond(request: Request, **options: object) -> Response:
    broker: Broker = request.app.state.broker
    families = await collect_async(broker, **options)  # type: ignore[arg-type]
    if sample_count(families) > THREAD_RENDER_SAMPLES:
        body = await trio.to_thread.run_sync(render, families)
    else:
        body = render(families)
    return Response(body, media_type=CONTENT_TYPE)


async def metrics(request: Request) -> Response:
    return await _respond(request)


async def metrics_per_object(request: Request) -> Response:
    return await _respond(request, per_object=True)


async def metrics_detailed(request: Request) -> Response:
    vhosts = request.query_params.getlist("vhost")
    return await _respond(
        request,
        detailed=request.query_params.getlist("family"),
        vhosts=vhosts or None,
    )


ROUTES = [
    Route("/metrics", metrics),
    Route("/metrics/per-object", metrics_per_object),
    Route("/metrics/detailed", metrics_detailed),
]


def create_metrics_app(broker: Broker) -> Starlette:
    """The app of the metrics port: the Prometheus endpoints alone."""
    app = Starlette(routes=list(ROUTES))
    app.state.broker = broker
    return app
