"""A real cluster (one etcd, three ``python -m tqbroker --cluster-etcd`` processes) seen through
its operations surface: ``/api/nodes`` lists the three nodes under their ``tqbroker@<id>``
names (each with its own figures; a killed one as not running), ``GET /cluster`` the nodes,
the controller and a two-partition topic's replicated partitions, ``topics describe`` and
``cluster status`` (``python -m tqbroker ctl``) their leaders, replicas and ISRs, the leader's
metrics their ISR and its followers' lag; once a follower is killed, the partitions it
replicated are under-replicated on every one of these.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.cluster_nodes import POLL, three_nodes
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually
from tqbroker.testing import BrokerProcess

NAMES = ["n0", "n1", "n2"]
TOPIC_QUEUES = ["t-0", "t-1"]


def api(process: BrokerProcess) -> httpx.Client:
    return httpx.Client(base_url=process.http_url, auth=("guest", "guest"), timeout=30)


def ctl(process: BrokerProcess, *args: str) -> str:
    url = f"http://guest:guest@{process.host}:{process.http_port}"
    done = subprocess.run(
        [sys.executable, "-m", "tqbroker", "ctl", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def wait_cluster(
    process: BrokerProcess, check: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    """``GET /cluster`` from ``process`` once ``check`` holds for it."""
    with api(process) as http:

        def checked() -> dict[str, Any] | None:
            found = http.get("/cluster").json()
            return dict(found) if check(found) else None

        return eventually(checked, timeout, POLL, what="GET /cluster")


def partitions(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["queue"]: p for p in found["partitions"] if p["queue"] in TOPIC_QUEUES}


def settled(found: dict[str, Any]) -> bool:
    """Three registered nodes, a controller, both partitions led with three in sync."""
    topic = partitions(found)
    return (
        len(found["nodes"]) == 3
        and found["controller"] is not None
        and len(topic) == 2
        and all(p["leader"] is not None and len(p["isr"]) == 3 for p in topic.values())
    )


def samples(process: BrokerProcess, name: str) -> dict[tuple[str, ...], float]:
    """A metric's samples on ``process``'s metrics port: (vhost, queue[, follower]) -> value."""
    text = httpx.get(process.metrics_url + "/metrics", timeout=30).text
    found: dict[tuple[str, ...], float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) + 1 :].rpartition("} ")
            pairs = dict(part.split("=", 1) for part in labels.split(","))
            named = {label: text.strip('"') for label, text in pairs.items()}
            key = [named[label] for label in ("vhost", "queue", "follower") if label in named]
            found[tuple(key)] = float(value)
    return found


def wait_samples(
    process: BrokerProcess,
    name: str,
    queue: str,
    check: Callable[[dict[tuple[str, ...], float]], bool],
    timeout: float = 60,
) -> dict[tuple[str, ...], float]:
    """A metric's samples of ``queue`` (in vhost ``/``) once ``check`` holds for them."""

    def checked() -> dict[tuple[str, ...], float] | None:
        found = {k: v for k, v in samples(process, name).items() if k[:2] == ("/", queue)}
        return found if check(found) else None

    return eventually(checked, timeout, POLL, what=f"{name} of {queue}")


def test_nodes_cluster_status_describe_and_metrics_of_a_three_node_cluster(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with three_nodes(tmp_path, etcd) as nodes:
        first = nodes.running["n0"]
        assert "created" in ctl(first, "topics", "create", "t", "--partitions", "2")
        found = wait_cluster(first, settled)

        # GET /cluster: this node, the controller, the nodes, the partitions.
        assert found["cluster"] is True
        assert found["node"] == "n0"
        assert found["controller"]["node"] in NAMES
        assert [n["id"] for n in found["nodes"]] == NAMES
        for entry in found["nodes"]:
            process = nodes.running[entry["id"]]
            assert entry["amqp"] == f"{process.host}:{process.port}"
            assert entry["http"] == process.http_url
            assert entry["incarnation"] > 0
            assert entry["controller"] is (entry["id"] == found["controller"]["node"])
        topic = partitions(found)
        for queue, partition in topic.items():
            assert partition["vhost"] == "/"
            assert sorted(partition["replicas"]) == NAMES, queue
            assert sorted(partition["isr"]) == NAMES, queue
            assert partition["leader"] in NAMES
            assert partition["epoch"] >= 1
            assert partition["min_isr"] == 2
            assert partition["state"] == "online"
            assert partition["under_replicated"] is False
            role = "leader" if partition["leader"] == "n0" else "follower"
            assert partition["local"]["role"] == role
        assert httpx.get(first.http_url + "/cluster").status_code == 401

        # GET /api/nodes and /api/nodes/{name}: every registered node.
        with api(first) as http:
            listed = http.get("/api/nodes").json()
            assert [n["name"] for n in listed] == [f"tqbroker@{n}" for n in NAMES]
            assert all(n["running"] is True and n["type"] == "disc" for n in listed)
            here = listed[0]
            assert here["mem_limit"] > 0  # this node's own figures
            assert here["fd_total"] > 0
            assert here["cluster"]["id"] == "n0"
            other = http.get("/api/nodes/tqbroker@n2").json()
            assert other["cluster"]["amqp"] == found["nodes"][2]["amqp"]
            assert other["mem_limit"] > 0  # its own figures, asked over the node-to-node link
            assert other["os_pid"] == str(nodes.running["n2"].proc.pid)
            assert http.get("/api/nodes/tqbroker@nosuch").status_code == 404
            assert http.get("/api/overview").json()["node"] == "tqbroker@n0"
            for n in range(20):
                sent = http.post("/topics/t/messages", json={"records": [{"value": f"m{n}"}]})
                assert sent.status_code == 201, sent.text

        # The leaders' metrics: ISR, under-replicated, each follower's lag.
        leader_of = {queue: p["leader"] for queue, p in topic.items()}
        for queue, leader in leader_of.items():
            key = ("/", queue)
            process = nodes.running[leader]
            assert samples(process, "tqbroker_stream_replicas")[key] == 3
            assert samples(process, "tqbroker_stream_in_sync_replicas")[key] == 3
            assert samples(process, "tqbroker_stream_under_replicated")[key] == 0
            lag = wait_samples(
                process,
                "tqbroker_stream_follower_lag",
                queue,
                lambda found: len(found) == 2,
            )
            assert {k[2] for k in lag} == set(NAMES) - {leader}
            assert all(v >= 0 for v in lag.values())
            for follower in set(NAMES) - {leader}:  # a partition is reported by its leader
                assert key not in samples(nodes.running[follower], "tqbroker_stream_replicas")

        # tqbroker-ctl: topics describe and cluster status.
        described = ctl(first, "topics", "describe", "t").splitlines()
        assert described[1].split()[-3:] == ["LEADER", "REPLICAS", "ISR"]
        for line in described[2:]:
            cells = line.split()
            assert cells[-3] == leader_of[cells[1]]
            assert sorted(cells[-2].split(",")) == NAMES
            assert sorted(cells[-1].split(",")) == NAMES
        status = ctl(first, "cluster", "status")
        assert f"Node: n0\tController: {found['controller']['node']}" in status
        for queue, leader in leader_of.items():
            [row] = [line.split() for line in status.splitlines() if f" {queue} " in line]
            assert row[:3] == ["/", queue, leader]
            assert row[-2:] == ["online", "false"]
        assert "Offline: 0\tUnderReplicated: 0" in status

        # A node other than n0 killed: every partition is under-replicated (led by another
        # in-sync replica where it led).
        victim = next(n for n in reversed(NAMES) if n not in leader_of.values() or n == "n2")
        nodes.running.pop(victim).kill()
        shrunk = wait_cluster(
            first,
            lambda c: all(
                len(p["isr"]) == 2 and victim not in p["isr"] and p["leader"] != victim
                for p in partitions(c).values()
            ),
        )
        assert victim not in [n["id"] for n in shrunk["nodes"]]
        assert all(p["under_replicated"] for p in partitions(shrunk).values())
        for queue, partition in partitions(shrunk).items():
            process = nodes.running[partition["leader"]]
            under = wait_samples(
                process,
                "tqbroker_stream_under_replicated",
                queue,
                lambda found: 1 in found.values(),
            )
            assert under[("/", queue)] == 1
            assert samples(process, "tqbroker_stream_in_sync_replicas")[("/", queue)] == 2
        status = ctl(first, "cluster", "status")
        assert "UnderReplicated: 2" in status
        with api(first) as http:  # RabbitMQ's: a member that is down, not running
            listed = http.get("/api/nodes").json()
            assert [n["name"] for n in listed] == [f"tqbroker@{n}" for n in NAMES]
            down = {n["name"]: n["running"] for n in listed}
            assert down == {f"tqbroker@{n}": n != victim for n in NAMES}
