"""``GET /cluster``: the cluster as this node sees it (``cluster_state.cluster_json``: its id,
the controller, the registered nodes, every replicated partition with its leader, epoch,
replicas, ISR, state and whether it is under-replicated), for ``tqbroker-ctl cluster status``
and monitoring. Management users only, as the ``/api`` routes. A broker on its own answers
200 ``{"cluster": false}``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .cluster_state import cluster_json, cluster_of
from .mgmt_common import api_user


async def cluster_status(request: Request) -> Response:
    """``GET /cluster``."""
    await api_user(request)
    node = cluster_of(request)
    if node is None:
        return JSONResponse({"cluster": False})
    return JSONResponse(cluster_json(node))


CLUSTER_ROUTES = [Route("/cluster", cluster_status)]
