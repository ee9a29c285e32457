"""A broker's place in a cluster (``cluster_etcd`` set: ``docs/cluster.md``): the etcd client and
the ``ClusterNode`` around the broker, made from the configuration.

``serve`` makes the node before the broker starts (a replicated stream is gated from its
first open), runs it once the broker has started and opens its listeners only after the node
has caught up with the cluster's definitions; it then ``advertise``s where clients reach it and
the node registers.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from ..broker.broker import Broker
from ..cluster.etcd import EtcdClient
from ..cluster.node import ClusterNode, ClusterSettings
from ..cluster.peers import join_address
from ..config import BrokerConfig
from .http.cluster_state import node_name

Address = tuple[str, int]


def cluster_node(broker: Broker, config: BrokerConfig) -> ClusterNode | None:
    """The node ``config`` asks for (None: no ``cluster_etcd``, one node on its own); the
    broker is named ``tqbroker@<node id>`` then."""
    if not config.cluster_etcd:
        return None
    settings = ClusterSettings(
        node_id=config.node_id,
        prefix=config.cluster_prefix,
        lease_ttl=config.cluster_lease_ttl,
        peer_host=config.host,
        peer_port=config.peer_port,
        advertise_peer_port=config.advertise_peer_port,
        advertise_host=advertised_host(config),
        placement="colocate" if config.cluster_placement == "colocate" else "spread",
        leader_rebalance_interval=config.cluster_leader_rebalance_interval,
    )
    node = ClusterNode(broker, EtcdClient(config.cluster_etcd), settings)
    broker.node_name = node_name(node.node_id)  # the management API's and metrics' name
    return node


def advertised_host(config: BrokerConfig) -> str:
    if config.advertise:
        return config.advertise
    return "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host


async def run_node(
    node: ClusterNode, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the node until cancelled (started once it has caught up), then close its client."""
    try:
        await node.run(task_status=task_status)
    finally:
        with trio.CancelScope(shield=True):
            await node.store.aclose()


def advertise(
    node: ClusterNode,
    config: BrokerConfig,
    amqp: Sequence[Address],
    http: Sequence[Address],
    kafka: Sequence[Address] = (),
) -> None:
    host = advertised_host(config)
    scheme = "https" if config.tls.http else "http"
    kafka_address = config.kafka_advertised_address or (
        join_address(host, kafka[0][1]) if kafka else ""
    )
    node.advertise(
        amqp=join_address(host, amqp[0][1]) if amqp else "",
        http=f"{scheme}://{join_address(host, http[0][1])}" if http else "",
        kafka=kafka_address,
    )
