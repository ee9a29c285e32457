"""Prometheus' HTTP endpoints, as RabbitMQ's ``rabbitmq_prometheus`` serves them: ``/metrics``
(queue figures summed), ``/metrics/per-object`` (per queue), ``/metrics/detailed?family=...``
(``&vhost=...``), and in a cluster the replicated partitions' families
(``metrics_cluster.py``); on their own port alone (``metrics_port``, 15692 as RabbitMQ's;
``serve_metrics``), not on the management API's. No credentials, as RabbitMQ's.

A scrape reads the broker on the event loop, giving way between queues (``collect_async``);
a large exposition (10k queues, per object) is rendered a slice at a time too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import prometheus_client
import trio
import trio.lowlevel
from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...broker.broker import Broker
from ...cluster.node import ClusterNode
from ..registry import Connections
from .metrics import QUEUE_NAMES, collect_async, per_queue
from .metrics_cluster import replication_families
from .metrics_names import DETAILED_FAMILIES

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


async def render_paced(families: Iterable[tuple[Metric, bool]]) -> bytes:
    """``render`` piece by piece with a checkpoint between: ``(piece, first)`` pairs, a piece
    after the first of its family rendered without its ``# HELP``/``# TYPE`` lines, so the text
    is the same as ``render``'s of the whole families."""
    parts: list[bytes] = []
    for piece, first in families:
        text = render([piece])
        parts.append(text if first else text.split(b"\n", 2)[2])
        await trio.lowlevel.checkpoint()
    return b"".join(parts)


def _whole(families: list[Metric]) -> Iterator[tuple[Metric, bool]]:
    return ((family, True) for family in families)


async def _respond(request: Request, *, per_object: bool) -> Response:
    broker: Broker = request.app.state.broker
    body = b""
    if per_object:
        body = await render_paced(per_queue(broker, QUEUE_NAMES, "rabbitmq_"))
    families = await collect_async(broker, per_object=per_object)
    cluster: ClusterNode | None = request.app.state.cluster
    if cluster is not None:
        families += replication_families(cluster)
    body += await render_paced(_whole(families))
    return Response(body, media_type=CONTENT_TYPE)


async def metrics(request: Request) -> Response:
    return await _respond(request, per_object=False)


async def metrics_per_object(request: Request) -> Response:
    return await _respond(request, per_object=True)


async def metrics_detailed(request: Request) -> Response:
    """RabbitMQ's ``/metrics/detailed?family=F&vhost=V`` (families it has that we have)."""
    params = request.query_params
    names = [n for f in params.getlist("family") for n in DETAILED_FAMILIES.get(f, ())]
    vhosts = params.getlist("vhost") or None
    pieces = per_queue(request.app.state.broker, names, "rabbitmq_detailed_", vhosts)
    return Response(await render_paced(pieces), media_type=CONTENT_TYPE)


ROUTES = [
    Route("/metrics", metrics),
    Route("/metrics/per-object", metrics_per_object),
    Route("/metrics/detailed", metrics_detailed),
]


def create_metrics_app(
    broker: Broker, connections: Connections, cluster: ClusterNode | None = None
) -> Starlette:
    """The app of the metrics port: the Prometheus endpoints alone (with the replicated
    partitions' families in a cluster: ``metrics_cluster.py``)."""
    del connections  # the metrics read the broker
    app = Starlette(routes=list(ROUTES))
    app.state.broker = broker
    app.state.cluster = cluster
    return app
