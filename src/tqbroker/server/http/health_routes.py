"""Health: the broker's own ``/health`` and RabbitMQ's alarm health checks.

Responsibilities:
- ``GET /health`` (no credentials, for probes): 200 ``ok``, or 503 ``degraded`` naming the
  backends that cannot write and the stream partitions whose log failed (a damaged frame below
  the high watermark: reads refuse it rather than step over it); the resource alarms in effect
  are listed either way;
- ``GET /api/health/checks/alarms`` and ``/api/health/checks/local-alarms`` (a broker user's
  credentials): RabbitMQ's answers, 200 ``{"status": "ok"}`` or 503 with the alarms in effect
  (``{"node", "resource"}``, resources ``disk space`` and ``memory``), the reason and
  ``"status": "failed"``. A single node: the cluster's alarms are the node's.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...broker.alarms import DISK
from ...broker.streams.service import partition_of
from .auth import broker_of, user_of

# RabbitMQ's names of the resources, in its health checks.
_RESOURCE_NAMES = {DISK: "disk space"}


async def health(request: Request) -> Response:
    """``GET /health``."""
    broker = broker_of(request)
    alarms = sorted(broker.alarms.active)
    unhealthy = sorted(f.backend.name for f in broker.flushers.values() if not f.backend.healthy)
    failed = [
        {"vhost": vhost.name, "queue": queue.name, "failure": partition.failure}
        for vhost in list(broker.vhosts.values())
        for queue in list(vhost.queues.values())
        if (partition := partition_of(queue)) is not None and partition.failure is not None
    ]
    if unhealthy or failed:
        found: dict[str, object] = {
            "status": "degraded",
            "failing_backends": unhealthy,
            "alarms": alarms,
        }
        if failed:
            found["failed_partitions"] = failed
        return JSONResponse(found, status_code=503)
    return JSONResponse({"status": "ok", "alarms": alarms})


async def alarms(request: Request) -> Response:
    """``GET /api/health/checks/alarms``."""
    return await _alarms(request, "There are alarms in effect in the cluster")


async def local_alarms(request: Request) -> Response:
    """``GET /api/health/checks/local-alarms``."""
    return await _alarms(request, "There are alarms in effect on the node")


async def _alarms(request: Request, reason: str) -> Response:
    await user_of(request)
    broker = broker_of(request)
    resources = sorted(_RESOURCE_NAMES.get(r, r) for r in broker.alarms.active)
    if not resources:
        return JSONResponse({"status": "ok"})
    found = [{"node": broker.node_name, "resource": resource} for resource in resources]
    return JSONResponse({"alarms": found, "reason": reason, "status": "failed"}, status_code=503)
