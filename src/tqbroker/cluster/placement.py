"""The controller's decisions, as pure functions over partition records: where a new stream's
replicas go, and who leads a partition whose leader is gone (Kafka's controller, §4.3 of
``shared/reference/scaleout.md``).

Responsibilities:
- ``place``: the replicas of a new partition, in preference order (the first is its preferred
  leader). ``spread`` puts each leader on the live node that leads fewest (then holds fewest
  replicas); ``colocate`` puts every leader on one node (the controller's: LavinMQ's
  single-leader model as a placement). Moving from one to the other is a placement change only;
- ``elect``: a clean election (Kafka's, unclean election being off) when the leader is gone
  (its node is not registered, or registered again: another incarnation): the new leader is the
  first replica, in preference order, that is live, in the ISR and whose replica is the one the
  ISR recorded and intact; the epoch goes up by one; the old leader leaves the ISR unless it is the
  last member (an ISR is never empty). With no such replica the partition is ``offline`` (no
  leader) until a member of its last ISR comes back;
- ``move_leader``: a controlled shutdown's move of leadership away from a node, to another
  eligible member (none: it stays);
- ``prefer_leader``: leadership back to the preferred replica once it is eligible again
  (Kafka's preferred leader election, which the controller runs every
  ``leader_rebalance_interval``: after a node's restart its partitions are led by it again).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final, Literal

import attrs

from .records import OFFLINE, ONLINE, PartitionRecord, ReplicaReport

Live = Mapping[str, int]  # the registered nodes: node id -> incarnation

SPREAD: Final = "spread"
COLOCATE: Final = "colocate"
Policy = Literal["spread", "colocate"]


def place(
    count: int,
    live: Sequence[str],
    existing: Collection[PartitionRecord],
    *,
    policy: Policy = SPREAD,
    leader_node: str | None = None,
) -> tuple[str, ...]:
    """``count`` live nodes (fewer if fewer are live) for a new partition's replicas, the
    preferred leader first (see the module doc); ``leader_node`` is ``colocate``'s."""
    if not live:
        return ()
    leaders = {node: 0 for node in live}
    holdings = {node: 0 for node in live}
    for record in existing:
        if record.replicas and record.replicas[0] in leaders:
            leaders[record.replicas[0]] += 1
        for node in record.replicas:
            if node in holdings:
                holdings[node] += 1
    if policy == COLOCATE and leader_node in leaders:
        first = leader_node
    else:
        first = min(live, key=lambda n: (leaders[n], holdings[n], n))
    rest = sorted((n for n in live if n != first), key=lambda n: (holdings[n], leaders[n], n))
    return (first, *rest[: max(0, count - 1)])


def eligible(
    record: PartitionRecord, node: str, live: Live, reports: Mapping[str, ReplicaReport]
) -> bool:
    """May ``node`` lead the partition: live, in the ISR, its replica the one the ISR recorded
    and intact."""
    report = reports.get(node)
    return (
        node in live
        and node in record.isr
        and report is not None
        and report.intact
        and report.replica_id == record.isr[node]
    )


def leader_live(record: PartitionRecord, live: Live) -> bool:
    """The partition's leader is registered, in the incarnation it was elected in."""
    return (
        record.state == ONLINE
        and record.leader is not None
        and live.get(record.leader) == record.leader_incarnation
    )


def elect(
    record: PartitionRecord, live: Live, reports: Mapping[str, ReplicaReport]
) -> PartitionRecord | None:
    """The record with a new leader when its leader is gone (see the module doc); None when
    nothing changes (the leader is live, or the partition stays offline)."""
    if leader_live(record, live):
        return None
    return _hand_over(record, record.leader, live, reports)


def move_leader(
    record: PartitionRecord,
    away_from: str,
    live: Live,
    reports: Mapping[str, ReplicaReport],
) -> PartitionRecord | None:
    """Leadership moved off ``away_from`` (it is shutting down) to another eligible member;
    None if it does not lead or no other member may."""
    if record.leader != away_from:
        return None
    others = {n: i for n, i in live.items() if n != away_from}
    if not any(eligible(record, n, others, reports) for n in record.replicas):
        return None
    return _hand_over(record, away_from, others, reports)


def prefer_leader(
    record: PartitionRecord, live: Live, reports: Mapping[str, ReplicaReport]
) -> PartitionRecord | None:
    """Leadership given back to the preferred replica (the first), when another leads and
    the preferred one is eligible (Kafka's preferred leader election); None otherwise."""
    preferred = record.replicas[0]
    if record.leader == preferred or not leader_live(record, live):
        return None
    if not eligible(record, preferred, live, reports):
        return None
    return _hand_over(record, record.leader, {preferred: live[preferred]}, reports)


def _hand_over(
    record: PartitionRecord,
    old: str | None,
    live: Live,
    reports: Mapping[str, ReplicaReport],
) -> PartitionRecord | None:
    candidates = [n for n in record.replicas if eligible(record, n, live, reports)]
    if not candidates:
        if record.state == OFFLINE and record.leader is None:
            return None
        return attrs.evolve(record, leader=None, state=OFFLINE)
    leader = candidates[0]
    isr = dict(record.isr)
    if old is not None and old != leader and old in isr and len(isr) > 1:
        del isr[old]
    return attrs.evolve(
        record,
        leader=leader,
        epoch=record.epoch + 1,
        isr=isr,
        state=ONLINE,
        leader_incarnation=live[leader],
    )
