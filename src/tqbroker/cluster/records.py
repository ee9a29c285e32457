"""What the cluster keeps in etcd: the key layout under the cluster's prefix and the records
stored there (CBOR maps), per ``shared/reference/scaleout.md`` §4.2.

Keys, under the cluster's prefix:
- ``nodes/{node}``: a ``NodeRecord`` (addresses, incarnation), written by the node, bound to
  its lease;
- ``controller``: a ``ControllerRecord``, written by the elected node, bound to its lease; its
  create revision fences the controller's writes;
- ``secret``: the cluster secret (32 random bytes), put-if-absent by the first node;
- ``partitions/{vhost}/{queue}``: a ``PartitionRecord`` (replicas, leader, epoch, ISR, min
  ISR), written by the controller (placement, leader, epoch) and the leader (ISR), each write
  a compare on the key's mod revision;
- ``replicas/{node}/{vhost}/{queue}``: a ``ReplicaReport`` (the replica's identity, whether it
  is intact), written by the node, bound to its lease;
- ``groups/{vhost}/{group}/members/{node}``: a ``GroupMembers`` (the node's members of a
  consumer group and the partitions each consumes), written by the node, bound to its lease;
- ``groups/{vhost}/{group}/assignment``: a ``GroupAssignment`` (each partition's member, the
  generation), written by the controller (a compare on its mod revision);
- ``requests/preferred-election``: a request (any node's) for a preferred leader election now;
  the controller deletes it once it has run one.

Nothing that changes at message rate is here: records, high watermarks, committed offsets and
follower progress stay with the partitions and travel between nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal
from urllib.parse import quote, unquote

import attrs
import cbor2

DEFAULT_PREFIX: Final = "/tqbroker"

ONLINE: Final = "online"
OFFLINE: Final = "offline"  # no live in-sync replica: no leader until one comes back


class RecordError(ValueError):
    """A stored value is not a record of the kind its key holds."""


def key_part(part: str) -> str:
    """A name as one segment of a key."""
    return quote(part, safe="")  # vhost "/" and names with slashes stay one path segment


def node_key(prefix: str, node: str) -> str:
    return f"{prefix}/nodes/{key_part(node)}"


def nodes_prefix(prefix: str) -> str:
    return f"{prefix}/nodes/"


def controller_key(prefix: str) -> str:
    return f"{prefix}/controller"


def secret_key(prefix: str) -> str:
    return f"{prefix}/secret"


def partition_path(vhost: str, queue: str) -> str:
    """A partition's name across the cluster (in fetches and logs): ``vhost/queue``, each
    part quoted."""
    return f"{key_part(vhost)}/{key_part(queue)}"


def parse_partition_path(path: str) -> tuple[str, str]:
    vhost, _, queue = path.partition("/")
    return unquote(vhost), unquote(queue)


def partition_key(prefix: str, vhost: str, queue: str) -> str:
    return f"{prefix}/partitions/{partition_path(vhost, queue)}"


def partitions_prefix(prefix: str) -> str:
    return f"{prefix}/partitions/"


def partition_name(prefix: str, key: str) -> tuple[str, str]:
    """The (vhost, queue) of a partition key."""
    return parse_partition_path(key.removeprefix(partitions_prefix(prefix)))


def replica_key(prefix: str, node: str, vhost: str, queue: str) -> str:
    return f"{prefix}/replicas/{key_part(node)}/{key_part(vhost)}/{key_part(queue)}"


def replicas_prefix(prefix: str) -> str:
    return f"{prefix}/replicas/"


def preferred_election_key(prefix: str) -> str:
    """A request for a preferred leader election now (any node writes it; the controller
    runs the election and deletes it)."""
    return f"{prefix}/requests/preferred-election"


def groups_prefix(prefix: str) -> str:
    return f"{prefix}/groups/"


def group_members_key(prefix: str, vhost: str, group: str, node: str) -> str:
    return f"{groups_prefix(prefix)}{key_part(vhost)}/{key_part(group)}/members/{key_part(node)}"


def group_assignment_key(prefix: str, vhost: str, group: str) -> str:
    return f"{groups_prefix(prefix)}{key_part(vhost)}/{key_part(group)}/assignment"


def _decode(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = cbor2.loads(raw)
    except (ValueError, cbor2.CBORDecodeError) as exc:
        raise RecordError(f"{what}: not CBOR ({exc})") from None
    if not isinstance(value, dict):
        raise RecordError(f"{what}: not a map")
    return value


@attrs.frozen
class NodeRecord:
    node: str
    incarnation: int  # the node's lease: new at every registration
    amqp: str = ""  # host:port clients connect to
    http: str = ""  # the HTTP API's base URL
    peer: str = ""  # host:port of the node-to-node link
    version: str = ""
    kafka: str = ""  # host:port Kafka clients connect to (its Kafka listener's)

    def encode(self) -> bytes:
        return cbor2.dumps(attrs.asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> NodeRecord:
        value = _decode(raw, "node record")
        try:
            return cls(
                node=str(value["node"]),
                incarnation=int(value["incarnation"]),
                amqp=str(value.get("amqp", "")),
                http=str(value.get("http", "")),
                peer=str(value.get("peer", "")),
                version=str(value.get("version", "")),
                kafka=str(value.get("kafka", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"node record: {exc}") from None


@attrs.frozen
class ControllerRecord:
    node: str
    incarnation: int

    def encode(self) -> bytes:
        return cbor2.dumps(attrs.asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> ControllerRecord:
        value = _decode(raw, "controller record")
        try:
            return cls(node=str(value["node"]), incarnation=int(value["incarnation"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"controller record: {exc}") from None


@attrs.frozen
class PartitionRecord:
    """One replicated partition's placement and leadership (Kafka's ``PartitionRecord``):
    ``isr`` maps each in-sync member's node to its replica identity."""

    replicas: tuple[str, ...]  # in preference order: the first is the preferred leader
    leader: str | None
    epoch: int
    isr: Mapping[str, str] = attrs.field(factory=dict)
    min_isr: int = 1
    state: Literal["online", "offline"] = ONLINE
    leader_incarnation: int = 0  # the leader's registration it was elected in

    def encode(self) -> bytes:
        return cbor2.dumps(
            {
                "replicas": list(self.replicas),
                "leader": self.leader,
                "epoch": self.epoch,
                "isr": dict(self.isr),
                "min_isr": self.min_isr,
                "state": self.state,
                "leader_incarnation": self.leader_incarnation,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> PartitionRecord:
        value = _decode(raw, "partition record")
        try:
            leader = value.get("leader")
            state = str(value.get("state", ONLINE))
            if state not in (ONLINE, OFFLINE):
                raise ValueError(f"state {state!r}")
            return cls(
                replicas=tuple(str(n) for n in value["replicas"]),
                leader=str(leader) if leader is not None else None,
                epoch=int(value["epoch"]),
                isr={str(k): str(v) for k, v in dict(value.get("isr", {})).items()},
                min_isr=int(value.get("min_isr", 1)),
                state=state,  # type: ignore[arg-type]
                leader_incarnation=int(value.get("leader_incarnation", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"partition record: {exc}") from None


@attrs.frozen
class ReplicaReport:
    """What a node says of its replica of a partition when it registers: its identity, and
    whether its log still holds everything it acknowledged (a log that recovery cut below the
    high watermark it had learned is not intact: it may not lead)."""

    replica_id: str
    intact: bool = True

    def encode(self) -> bytes:
        return cbor2.dumps(attrs.asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> ReplicaReport:
        value = _decode(raw, "replica report")
        try:
            return cls(replica_id=str(value["replica_id"]), intact=bool(value.get("intact", True)))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"replica report: {exc}") from None


@attrs.frozen
class GroupMembers:
    """One node's members of a consumer group, in join order: each member's id (unique in the
    cluster) and the partitions (stream queues) it consumes."""

    members: tuple[tuple[str, tuple[str, ...]], ...]

    def encode(self) -> bytes:
        return cbor2.dumps({"members": [[m, list(ps)] for m, ps in self.members]})

    @classmethod
    def decode(cls, raw: bytes) -> GroupMembers:
        value = _decode(raw, "group members")
        try:
            return cls(tuple((str(m), tuple(str(p) for p in ps)) for m, ps in value["members"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"group members: {exc}") from None


@attrs.frozen
class GroupAssignment:
    """A consumer group's assignment across the cluster: each partition's member, and the
    generation (one more at every change: it fences the commits of revoked members)."""

    generation: int
    owners: Mapping[str, str] = attrs.field(factory=dict)  # queue -> member id

    def encode(self) -> bytes:
        return cbor2.dumps({"generation": self.generation, "owners": dict(self.owners)})

    @classmethod
    def decode(cls, raw: bytes) -> GroupAssignment:
        value = _decode(raw, "group assignment")
        try:
            owners = {str(q): str(m) for q, m in dict(value.get("owners", {})).items()}
            return cls(int(value["generation"]), owners)
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"group assignment: {exc}") from None
