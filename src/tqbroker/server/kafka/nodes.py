"""Which brokers a Kafka client is told about, and which of them leads what.

On one node: this node alone (node id 0, at the address the client connected to or
``kafka_advertised_address``) leads every partition and coordinates every group. In a cluster
(``tqbroker.cluster``): every live node that has a Kafka listener (the ``kafka`` address of its
node record), under a Kafka node id made from its node name (``kafka_node_id``: the same on
every node); a replicated partition's leader, replicas and in-sync replicas are its partition
record's; each group has one coordinator, picked among those nodes by rendezvous hashing of
the group id (every node picks the same one while they agree on who is live; when the
coordinator leaves, its groups move, and their members, told ``NOT_COORDINATOR``, find the new
one, as Kafka's clients do when ``__consumer_offsets`` leaders move).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

import attrs

from ...cluster.node import ClusterNode
from ...cluster.records import ONLINE

LOCAL_NODE_ID = 0
Address = tuple[str, int]


def kafka_node_id(node: str) -> int:
    """A cluster node's Kafka node id: a non-negative int32 from its name."""
    return zlib.crc32(node.encode()) & 0x7FFFFFFF


@attrs.frozen
class KafkaBroker:
    node_id: int
    host: str
    port: int


@attrs.frozen
class Placement:
    """A partition's leader (None: none online), replicas and in-sync replicas, as Kafka node
    ids."""

    leader: int | None
    replicas: list[int]
    isr: list[int]


class KafkaNodes:
    """The brokers and leaders a Kafka client is told about (see the module doc)."""

    def __init__(self, cluster: ClusterNode | None) -> None:
        self.cluster = cluster

    @property
    def this_node_id(self) -> int:
        cluster = self.cluster
        return LOCAL_NODE_ID if cluster is None else kafka_node_id(cluster.node_id)

    def brokers(self, here: Address) -> list[KafkaBroker]:
        """This node (at ``here``) and, in a cluster, every other live node with a Kafka
        listener."""
        found = [KafkaBroker(self.this_node_id, *here)]
        cluster = self.cluster
        if cluster is None:
            return found
        for node, record in sorted(cluster.view.nodes.items()):  # the registered ones
            if node == cluster.node_id or not record.kafka:
                continue
            host, _, port = record.kafka.rpartition(":")
            if port.isdigit():
                found.append(KafkaBroker(kafka_node_id(node), host.strip("[]"), int(port)))
        return found

    def placement(self, vhost: str, queue: str, live: Sequence[int]) -> Placement | None:
        """A replicated partition's placement (None: the partition is this node's alone);
        a leader that is not among ``live`` (the brokers told about) is None."""
        cluster = self.cluster
        if cluster is None:
            return None
        found = cluster.view.partitions.get((vhost, queue))
        if found is None:
            return None
        record = found[0]
        replicas = [kafka_node_id(node) for node in record.replicas]
        isr = [kafka_node_id(node) for node in record.replicas if node in record.isr]
        leader = None
        if record.leader is not None and record.state == ONLINE:
            leader = kafka_node_id(record.leader)
        return Placement(leader if leader in live else None, replicas, isr)

    def coordinator(self, group: str, here: Address) -> KafkaBroker:
        """The broker that coordinates ``group``."""
        brokers = self.brokers(here)
        return max(brokers, key=lambda broker: _weight(group, broker.node_id))

    def coordinates(self, group: str, here: Address) -> bool:
        """Whether this node coordinates ``group``."""
        return self.coordinator(group, here).node_id == self.this_node_id


def _weight(group: str, node_id: int) -> bytes:
    return hashlib.blake2b(f"{group}\0{node_id}".encode(), digest_size=8).digest()
