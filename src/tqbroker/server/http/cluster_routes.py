"""``GET /cluster``: the cluster as this node sees it (``cluster_state.cluster_json``: its id,
the controller, the registered nodes, every replicated partition with its leader, epoch,
replicas, ISR, state and whether it is under-replicated), for ``tqbroker-ctl cluster status``
and monitoring. Management users only, as the ``/api`` routes. A broker on its own answers
200 ``{"cluster": false}``.

``POST /cluster/preferred-election`` (administrators; Kafka's ``kafka-leader-election
--election-type preferred``): the controller gives each partition back to its preferred
replica where that one is eligible, at once; the answer, once it has run (30 s at most: 504
then), lists the partitions led by their preferred replica and those that are not.
"""

from __future__ import annotations

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...cluster.records import partition_path, preferred_election_key
from .cluster_state import cluster_json, cluster_of
from .errors import ApiError
from .mgmt_common import api_user

ELECTION_SECONDS = 30.0


async def cluster_status(request: Request) -> Response:
    """``GET /cluster``."""
    await api_user(request)
    node = cluster_of(request)
    if node is None:
        return JSONResponse({"cluster": False})
    return JSONResponse(cluster_json(node))


async def preferred_election(request: Request) -> Response:
    """``POST /cluster/preferred-election``."""
    if not (await api_user(request)).is_administrator:
        raise ApiError(401, "not_authorised", "Not administrator user")
    node = cluster_of(request)
    if node is None:
        raise ApiError(400, "bad_request", "not a cluster: the broker runs on its own")
    view = node.view
    revision = await node.store.put(preferred_election_key(view.prefix), b"requested")
    await view.wait_for(revision)
    with trio.move_on_after(ELECTION_SECONDS):
        while view.preferred_election:
            await view.wait_for(view.revision + 1)
        preferred: list[str] = []
        other: list[str] = []
        for (vhost, queue), (record, _mod) in sorted(view.partitions.items()):
            led = record.leader == record.replicas[0]
            (preferred if led else other).append(partition_path(vhost, queue))
        return JSONResponse({"preferred": preferred, "not_preferred": other})
    raise ApiError(504, "timeout", "no controller ran the election in time")


CLUSTER_ROUTES = [
    Route("/cluster", cluster_status),
    Route("/cluster/preferred-election", preferred_election, methods=["POST"]),
]
