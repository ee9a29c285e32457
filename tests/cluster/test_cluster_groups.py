"""Consumer groups across a real three-node cluster (``cluster/groups.py``): members of one group
connected to different nodes split a six-partition topic between them as members on one node do
(each partition read by exactly one member, two each), the partitions of a member that leaves go
to the others, its node's members' entry goes with a killed node's lease, and the group's commits
reach every replica (no lag left on any node once everything is acked); every node describes the
whole group."""

from __future__ import annotations

import functools
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pika
import pika.exceptions
import pytest

from tests.support.cluster_nodes import POLL, three_nodes
from tests.support.cluster_topic import SETTLE, Topic
from tests.support.etcd import EtcdProcess
from tests.support.group_members import PARTITIONS, Member, pump, settle
from tests.support.polling import eventually
from tqbroker.testing import BrokerProcess

pytestmark = pytest.mark.timeout(300)


def publish(process: BrokerProcess, start: int, count: int) -> None:
    """``count`` messages through the topic's exchange on ``process``, confirmed (a nacked
    one sent again)."""
    connection = pika.BlockingConnection(pika.URLParameters(process.url))
    ch = connection.channel()
    ch.confirm_delivery()
    for n in range(start, start + count):
        eventually(functools.partial(_published, ch, n), SETTLE, POLL, what=f"message {n}")
    connection.close()


def _published(ch: Any, n: int) -> bool:
    try:
        ch.basic_publish("orders", f"key-{n}", b"%d" % n)
    except pika.exceptions.NackError:
        return False
    return True


def offsets_by_partition(members: list[Member]) -> dict[int, set[int]]:
    found: dict[int, set[int]] = defaultdict(set)
    for member in members:
        for partition, offset in member.received:
            found[partition].add(offset)
    return found


def lag_everywhere(processes: list[BrokerProcess], group: str) -> list[int | None]:
    lags = []
    for process in processes:
        with httpx.Client(base_url=process.http_url, auth=("guest", "guest")) as api:
            found = api.get(f"/topics/orders/groups/{group}")
            lags.append(found.json()["lag"] if found.status_code == 200 else None)
    return lags


def described(process: BrokerProcess, group: str) -> tuple[int, int]:
    """What ``process`` says of the group: its members, and how many partitions have a reader
    (``tqbroker-ctl groups describe``'s routes)."""
    with httpx.Client(base_url=process.http_url, auth=("guest", "guest")) as api:
        groups = api.get("/topics/orders/groups").json()
        found = api.get(f"/topics/orders/groups/{group}").json()
    members = next(g["members"] for g in groups if g["group"] == group)
    return members, sum(p["reader"] is not None for p in found["partitions"])


def test_members_on_three_nodes_split_the_partitions_and_take_over_a_leaver_s(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with three_nodes(tmp_path, etcd) as nodes:
        topic = Topic(nodes, PARTITIONS)
        topic.create()
        processes = [nodes.running[f"n{n}"] for n in range(3)]
        members = [Member(process.url) for process in processes]  # one on each node
        settle(members, 1.0)
        publish(processes[0], 0, 600)
        pump(members, 600, timeout=SETTLE)
        owned = [m.partitions for m in members]
        assert [len(p) for p in owned] == [2, 2, 2], owned  # one reader per partition
        assert set().union(*owned) == set(range(PARTITIONS))
        for process in processes:  # every node describes the whole group
            whole = functools.partial(lambda p: described(p, "billing") == (3, 6), process)
            eventually(whole, SETTLE, POLL, what=f"the group described on {process.url}")

        members[2].close()  # it leaves: its two partitions go to the members on n0 and n1
        publish(processes[1], 600, 600)
        pump(members[:2], 1200, SETTLE, counted=members)
        late = [{p for p, o in m.received if o >= 100} for m in members[:2]]
        assert sorted(len(p) for p in late) == [3, 3], late
        by_partition = offsets_by_partition(members)
        assert sum(len(offsets) for offsets in by_partition.values()) == 1200
        for offsets in by_partition.values():  # nothing skipped
            assert offsets == set(range(len(offsets)))
        settle(members[:2], 0.5)
        eventually(
            lambda: lag_everywhere(processes, "billing") == [0, 0, 0],
            SETTLE,
            POLL,
            what="the group's commits on every node",
        )

        nodes.running.pop("n1").kill()  # its member's partitions go with its lease
        topic.wait_led("the partitions led by n0 and n2")
        publish(processes[0], 1200, 300)
        pump(members[:1], 1500, SETTLE, counted=members)
        assert members[0].partitions == set(range(PARTITIONS))
        for offsets in offsets_by_partition(members).values():  # resumed at the commits
            assert offsets == set(range(len(offsets)))
        members[0].close()
