"""A partitioned topic on a real three-node cluster, through the HTTP topic API: declared on one
node, its six partitions exist on every node, each with three replicas and the leaders spread
over the nodes; records produced through another node (forwarded to each partition's leader)
are durable on every replica and read back, in order, from a third. With ``cluster_placement =
"colocate"`` every leader is on one node: the controller's. A node killed and restarted leads
its share again at the next preferred leader election (``cluster_leader_rebalance_interval``),
or at once with ``tqbroker-ctl cluster elect-leaders``."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.cluster_nodes import POLL, Nodes, partition_records, three_nodes
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually
from tqbroker.cluster.records import PartitionRecord

PARTITIONS = 6


def records_of(nodes: Nodes) -> dict[str, PartitionRecord]:
    return partition_records(nodes, "orders", PARTITIONS)


def total(api: httpx.Client) -> int:
    return sum(p["latest"] for p in api.get("/topics/orders/offsets").json()["partitions"])


def has_all(api: httpx.Client) -> bool:
    return total(api) == 300


def in_sync(placed: dict[str, PartitionRecord]) -> dict[str, PartitionRecord] | None:
    """The records, once every partition has one with three in-sync replicas."""
    ready = len(placed) == PARTITIONS and all(len(r.isr) == 3 for r in placed.values())
    return placed if ready else None


def test_a_partitioned_topic_spreads_its_leaders_and_takes_records_on_any_node(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with three_nodes(tmp_path, etcd) as nodes:
        apis = [
            httpx.Client(base_url=process.http_url, auth=("guest", "guest"), timeout=30)
            for process in nodes.running.values()
        ]
        response = apis[0].put("/topics/orders", json={"partitions": PARTITIONS})
        assert response.status_code == 201, response.text
        placed = eventually(
            lambda: in_sync(records_of(nodes)),
            60,
            POLL,
            what="six partitions, each with three in-sync replicas",
        )
        leaders = Counter(record.leader for record in placed.values())
        assert sorted(leaders.values()) == [2, 2, 2], leaders  # spread: two each
        records = [{"key": f"k{n % 12}", "value": f"v{n}"} for n in range(300)]
        response = apis[1].post("/topics/orders/messages", json={"records": records})
        assert response.status_code == 201, response.text
        landed = response.json()["offsets"]
        assert len(landed) == 300
        for api in apis:
            eventually(
                functools.partial(has_all, api),
                30,
                POLL,
                what=f"300 records on {api.base_url}",
            )
        by_partition: dict[int, list[str]] = {}
        for record, where in zip(records, landed, strict=True):
            by_partition.setdefault(where["partition"], []).append(str(record["value"]))
        for partition, values in by_partition.items():
            read = apis[2].get(
                "/topics/orders/messages",
                params={"partition": partition, "offset": 0, "limit": 300},
            )
            assert read.status_code == 200, read.text
            assert [m["value"] for m in read.json()["messages"]][: len(values)] == values
        for api in apis:
            api.close()


@contextmanager
def topic_on_three(tmp_path: Path, etcd: EtcdProcess, settings: str) -> Iterator[Nodes]:
    """Three nodes with ``settings`` (and a 3 s lease), the topic ``orders`` made on n0."""
    nodes = Nodes(tmp_path, etcd)
    nodes.config.write_text(f"cluster_lease_ttl = 3\n{settings}\n")
    try:
        for n in range(3):
            nodes.start(n)
        with httpx.Client(base_url=nodes.running["n0"].http_url, auth=("guest", "guest")) as api:
            response = api.put("/topics/orders", json={"partitions": PARTITIONS})
            assert response.status_code == 201, response.text
        yield nodes
    finally:
        nodes.stop_all()


def test_colocated_placement_puts_every_leader_on_the_controller(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with topic_on_three(tmp_path, etcd, 'cluster_placement = "colocate"') as nodes:
        controller = eventually(nodes.controller, 60, POLL, what="a controller")
        placed = eventually(
            lambda: in_sync(records_of(nodes)), 60, POLL, what="six partitions in sync"
        )
        assert {record.leader for record in placed.values()} == {controller}


def spread(nodes: Nodes) -> dict[str, PartitionRecord] | None:
    """The records, once in sync with their leaders two on each node."""
    placed = in_sync(records_of(nodes))
    if placed is None:
        return None
    leaders = Counter(record.leader for record in placed.values())
    return placed if sorted(leaders.values()) == [2, 2, 2] else None


def test_a_restarted_node_leads_its_share_again_after_the_preferred_election(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with topic_on_three(tmp_path, etcd, "cluster_leader_rebalance_interval = 2") as nodes:
        before = eventually(lambda: spread(nodes), 60, POLL, what="leaders spread")
        victim = "n1"
        nodes.running.pop(victim).kill()
        eventually(
            lambda: all(r.leader != victim for r in records_of(nodes).values()),
            60,
            POLL,
            what=f"leaders off {victim}",
        )
        nodes.start(1)
        after = eventually(lambda: spread(nodes), 90, POLL, what=f"{victim} leading again")
        # Each partition led by its preferred replica again: as placed at first.
        assert {q: r.leader for q, r in after.items()} == {q: r.leader for q, r in before.items()}


def test_elect_leaders_gives_a_restarted_node_its_share_at_once(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with topic_on_three(tmp_path, etcd, "cluster_leader_rebalance_interval = 0") as nodes:
        first = nodes.running["n0"]
        before = eventually(lambda: spread(nodes), 60, POLL, what="leaders spread")
        nodes.running.pop("n2").kill()
        eventually(
            lambda: all(r.leader != "n2" for r in records_of(nodes).values()),
            60,
            POLL,
            what="leaders off n2",
        )
        nodes.start(2)
        eventually(lambda: in_sync(records_of(nodes)), 90, POLL, what="n2 back in sync")
        assert spread(nodes) is None  # no automatic election: n2 leads nothing yet
        url = first.http_url.replace("http://", "http://guest:guest@")
        elected = subprocess.run(
            [sys.executable, "-m", "tqbroker", "ctl", "--url", url, "cluster", "elect-leaders"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert elected.returncode == 0, elected.stderr
        assert elected.stdout.splitlines() == [
            f"Led by their preferred replica: {PARTITIONS} partition(s)"
        ]
        after = records_of(nodes)
        assert {q: r.leader for q, r in after.items()} == {q: r.leader for q, r in before.items()}
        with httpx.Client(base_url=first.http_url, auth=("guest", "guest")) as api:
            made = api.put("/api/users/watcher", json={"password": "w", "tags": "monitoring"})
            assert made.status_code == 201, made.text
        with httpx.Client(base_url=first.http_url, auth=("watcher", "w")) as api:
            refused = api.post("/cluster/preferred-election")  # administrators only
            assert refused.status_code == 401, refused.text
            assert refused.json()["reason"] == "Not administrator user"
