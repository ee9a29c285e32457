"""The controller's placement and elections as properties over random clusters: replicas on
distinct live nodes, leaders spread (or kept on one node), clean elections only (an ISR member
whose replica is the recorded one and intact), preferred elections only to an eligible first
replica, epochs that only go up, an ISR never empty; and
the records' encoding round-trips."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tqbroker.cluster.placement import (
    COLOCATE,
    elect,
    eligible,
    leader_live,
    move_leader,
    place,
    prefer_leader,
)
from tqbroker.cluster.records import (
    OFFLINE,
    ONLINE,
    NodeRecord,
    PartitionRecord,
    RecordError,
    ReplicaReport,
    partition_key,
    partition_name,
)

NODES = [f"n{i}" for i in range(5)]


@st.composite
def partitions(
    draw: st.DrawFn,
) -> tuple[PartitionRecord, dict[str, int], dict[str, ReplicaReport]]:
    replicas = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True))
    isr_nodes = draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    isr = {n: f"id-{n}" for n in isr_nodes}
    leader = draw(st.sampled_from([None, *isr_nodes]))
    record = PartitionRecord(
        replicas=tuple(replicas),
        leader=leader,
        epoch=draw(st.integers(0, 50)),
        isr=isr,
        min_isr=draw(st.integers(1, 3)),
        state=ONLINE if leader is not None else draw(st.sampled_from([ONLINE, OFFLINE])),
        leader_incarnation=7,
    )
    # Live nodes and their incarnations: 7 is the one the leader was elected in.
    live = draw(st.dictionaries(st.sampled_from(NODES), st.sampled_from([7, 8])))
    reports = {}
    for node in replicas:
        kind = draw(st.sampled_from(["same", "new-identity", "damaged", "missing"]))
        if kind == "same":
            reports[node] = ReplicaReport(f"id-{node}")
        elif kind == "new-identity":
            reports[node] = ReplicaReport(f"other-{node}")
        elif kind == "damaged":
            reports[node] = ReplicaReport(f"id-{node}", intact=False)
    return record, live, reports


@given(partitions())
def test_an_election_is_clean(
    case: tuple[PartitionRecord, dict[str, int], dict[str, ReplicaReport]],
):
    record, live, reports = case
    after = elect(record, live, reports)
    if record.leader is not None and live.get(record.leader) == 7 and record.state == ONLINE:
        assert after is None  # a live leader keeps its partition
        return
    if after is None:
        assert record.state == OFFLINE
        assert record.leader is None
        return
    assert after.isr  # never empty
    assert set(after.isr) <= set(record.isr)
    assert after.replicas == record.replicas
    if after.leader is None:
        assert after.state == OFFLINE
        assert after.epoch == record.epoch
        assert not any(eligible(record, n, live, reports) for n in record.replicas)
    else:
        assert after.state == ONLINE
        assert after.epoch == record.epoch + 1
        assert eligible(record, after.leader, live, reports)
        assert after.leader in after.isr
        assert after.leader_incarnation == live[after.leader]
        # The first eligible replica in preference order.
        first = next(n for n in record.replicas if eligible(record, n, live, reports))
        assert after.leader == first


@given(partitions())
def test_a_controlled_shutdown_moves_leadership_to_an_eligible_member(
    case: tuple[PartitionRecord, dict[str, int], dict[str, ReplicaReport]],
) -> None:
    record, live, reports = case
    if record.leader is None:
        return
    live = {**live, record.leader: 7}
    after = move_leader(record, record.leader, live, reports)
    if after is None:
        others = {n: i for n, i in live.items() if n != record.leader}
        assert not any(eligible(record, n, others, reports) for n in record.replicas)
        return
    assert after.leader != record.leader
    assert after.leader is not None
    assert eligible(record, after.leader, live, reports)
    assert after.epoch == record.epoch + 1


@given(partitions())
def test_a_preferred_election_gives_the_first_replica_back_its_lead_when_it_may(
    case: tuple[PartitionRecord, dict[str, int], dict[str, ReplicaReport]],
) -> None:
    record, live, reports = case
    after = prefer_leader(record, live, reports)
    preferred = record.replicas[0]
    may = (
        record.leader != preferred
        and leader_live(record, live)
        and eligible(record, preferred, live, reports)
    )
    if not may:
        assert after is None  # a leader that is gone is elect()'s; a preferred one stays
        return
    assert after is not None
    assert after.leader == preferred
    assert after.epoch == record.epoch + 1
    assert after.leader_incarnation == live[preferred]
    assert after.isr  # never empty
    assert set(after.isr) <= set(record.isr)


@given(
    st.integers(1, 5),
    st.lists(st.sampled_from(NODES), min_size=1, unique=True),
    st.integers(0, 30),
)
def test_placement_spreads_leaders_over_live_nodes(count: int, live: list[str], existing: int):
    placed: list[PartitionRecord] = []
    for _ in range(existing):
        replicas = place(count, live, placed)
        assert len(replicas) == min(count, len(live))
        assert len(set(replicas)) == len(replicas)
        assert set(replicas) <= set(live)
        placed.append(PartitionRecord(replicas, replicas[0], 0, {n: n for n in replicas}))
    leaders = Counter(record.replicas[0] for record in placed)
    if placed:
        counts = [leaders.get(node, 0) for node in live]
        assert max(counts) - min(counts) <= 1  # leaders spread evenly


def test_colocated_placement_keeps_every_leader_on_one_node() -> None:
    placed: list[PartitionRecord] = []
    for _ in range(6):
        replicas = place(3, NODES[:3], placed, policy=COLOCATE, leader_node="n1")
        placed.append(PartitionRecord(replicas, replicas[0], 0, {}))
    assert {record.replicas[0] for record in placed} == {"n1"}
    holdings = Counter(node for record in placed for node in record.replicas)
    assert holdings == {"n0": 6, "n1": 6, "n2": 6}


@given(partitions())
def test_records_round_trip(case: tuple[PartitionRecord, dict[str, int], dict[str, ReplicaReport]]):
    record, _live, reports = case
    assert PartitionRecord.decode(record.encode()) == record
    for report in reports.values():
        assert ReplicaReport.decode(report.encode()) == report


@pytest.mark.parametrize("raw", [b"", b"\xff", b"\x01", b"\xa0"])
def test_a_damaged_record_is_a_record_error(raw: bytes) -> None:
    for kind in (PartitionRecord, NodeRecord, ReplicaReport):
        with pytest.raises(RecordError):
            kind.decode(raw)


def test_partition_keys_keep_vhost_and_queue_apart() -> None:
    key = partition_key("/tq", "/", "orders/eu-0")
    assert key == "/tq/partitions/%2F/orders%2Feu-0"
    assert partition_name("/tq", key) == ("/", "orders/eu-0")
