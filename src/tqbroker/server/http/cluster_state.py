"""What the HTTP layer says of the cluster this broker is a node of: the ``ClusterNode`` in
``app.state.cluster`` (None for a broker on its own), and its view of etcd as JSON (registered
nodes, the controller, the replicated partitions). Everything is read from the node's cached
view: nothing here waits for etcd.

Each partition is ``online`` or ``offline`` (no live in-sync replica: no leader) as its record
says, and ``under_replicated`` while its ISR is smaller than its replica list (Kafka's
``UnderReplicated``). A partition this node holds also says its role here (``leader``,
``follower`` or ``standby``) and the high watermark it has reached.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ...cluster.follower import FollowerReplica
from ...cluster.leader import LeaderReplica
from ...cluster.node import ClusterNode
from ...cluster.records import ControllerRecord, NodeRecord, PartitionRecord


def cluster_of(request: Request) -> ClusterNode | None:
    """The cluster node the app's broker is (None: a broker on its own)."""
    node = getattr(request.app.state, "cluster", None)
    assert node is None or isinstance(node, ClusterNode)
    return node


def node_name(node_id: str) -> str:
    """A node's name as the management API names it (``broker.node_name`` in a cluster)."""
    return f"tqbroker@{node_id}"


def node_json(record: NodeRecord, controller: ControllerRecord | None) -> dict[str, Any]:
    """What the view knows of a registered node."""
    return {
        "id": record.node,
        "name": node_name(record.node),
        "amqp": record.amqp,
        "http": record.http,
        "peer": record.peer,
        "incarnation": record.incarnation,
        "version": record.version,
        "controller": controller is not None and controller.node == record.node,
    }


def replication_json(record: PartitionRecord) -> dict[str, Any]:
    """A partition record's leader, epoch, replicas and ISR (in replica order), its state."""
    return {
        "leader": record.leader,
        "epoch": record.epoch,
        "replicas": list(record.replicas),
        "isr": [n for n in record.replicas if n in record.isr],
        "min_isr": record.min_isr,
        "state": record.state,
        "under_replicated": len(record.isr) < len(record.replicas),
    }


def local_role(node: ClusterNode, vhost: str, queue: str) -> dict[str, Any] | None:
    """This node's role for a partition it holds (None: it holds none)."""
    held = node.roles.held.get((vhost, queue))
    if held is None:
        return None
    role = held.role
    if isinstance(role, LeaderReplica):
        return {"role": "leader", "high_watermark": role.high_watermark}
    if isinstance(role, FollowerReplica):
        return {
            "role": "follower",
            "high_watermark": role.high_watermark,
            "log_end_offset": held.partition.log_end_offset,
            "last_error": role.last_error,
        }
    return {"role": "standby", "high_watermark": role.high_watermark, "why": role.why}


def cluster_json(node: ClusterNode) -> dict[str, Any]:
    """``GET /cluster``: this node, the controller, the nodes and the replicated partitions."""
    view = node.view
    controller = view.controller
    partitions = []
    for (vhost, queue), (record, _mod) in sorted(view.partitions.items()):
        found = {"vhost": vhost, "queue": queue, **replication_json(record)}
        here = local_role(node, vhost, queue)
        if here is not None:
            found["local"] = here
        partitions.append(found)
    return {
        "cluster": True,
        "node": node.node_id,
        "controller": None
        if controller is None
        else {"node": controller.node, "incarnation": controller.incarnation},
        "nodes": [node_json(r, controller) for _id, r in sorted(view.nodes.items())],
        "partitions": partitions,
    }
