"""Kafka clients on a real three-node cluster: every node's Metadata lists the three brokers
(their Kafka listeners) and each partition's leader, replicas and in-sync replicas as its
partition record has them (Kafka's ``MetadataResponse``: a client sends each partition's
produce to its leader); each group has one coordinator, the same from every node
(``FindCoordinator``), and the other nodes answer its group requests ``NOT_COORDINATOR`` (16,
``Errors.java``), as brokers that do not lead the group's ``__consumer_offsets`` partition do.
confluent-kafka produces keyed records through one node and a group reads them all through
another; in the slow set, a leader is killed with kill -9 and the producer goes on through
the new leaders."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer

from tests.kafka_listener.raw import call
from tests.support.cluster_nodes import POLL, Nodes, partition_records, three_nodes
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually
from tqbroker.cluster.records import PartitionRecord
from tqbroker.server.kafka.nodes import kafka_node_id

pytestmark = pytest.mark.timeout(240)
PARTITIONS = 6
TOPIC = "korders"


def records_of(nodes: Nodes) -> dict[str, PartitionRecord]:
    return partition_records(nodes, TOPIC, PARTITIONS)


def in_sync(nodes: Nodes) -> dict[str, PartitionRecord] | None:
    placed = records_of(nodes)
    ready = len(placed) == PARTITIONS and all(len(r.isr) == 3 for r in placed.values())
    return placed if ready else None


def metadata(bootstrap: str) -> Any:
    return call(bootstrap, 3, 5, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})


def leaders_match(nodes: Nodes, bootstrap: str) -> bool:
    """Whether ``bootstrap``'s Metadata gives every partition the leader its record has."""
    placed = records_of(nodes)
    (topic,) = metadata(bootstrap)["topics"]
    for partition in topic["partitions"]:
        record = placed[f"{TOPIC}-{partition['partition_index']}"]
        if record.leader is None or partition["leader_id"] != kafka_node_id(record.leader):
            return False
    return True


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdProcess) -> Iterator[Nodes]:
    with three_nodes(tmp_path, etcd) as nodes:
        first = next(iter(nodes.running.values()))
        with httpx.Client(base_url=first.http_url, auth=("guest", "guest"), timeout=30) as http:
            response = http.put(f"/topics/{TOPIC}", json={"partitions": PARTITIONS})
            assert response.status_code == 201, response.text
        eventually(lambda: in_sync(nodes), 60, POLL, what="six partitions, three replicas each")
        yield nodes


def produce(bootstrap: str, values: range) -> list[Any]:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "acks": "all"}
    )
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    for n in values:
        producer.produce(TOPIC, key=b"k%d" % (n % 12), value=b"v%d" % n, on_delivery=delivered)
    assert producer.flush(60) == 0
    return failed


def consume_all(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kgroup", "auto.offset.reset": "earliest"}
    )
    got: list[bytes] = []
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append(message.value() or b"")
    finally:
        consumer.close()
    return got


def test_metadata_names_every_node_and_each_partitions_leader(cluster: Nodes) -> None:
    processes = list(cluster.running.items())
    expected = {
        kafka_node_id(name): (process.host, process.kafka_port) for name, process in processes
    }
    for _name, process in processes:
        matched = functools.partial(leaders_match, cluster, process.kafka_bootstrap)
        eventually(matched, 30, POLL, what=f"the leaders in {process.kafka_bootstrap}'s metadata")
        answer = metadata(process.kafka_bootstrap)
        brokers = {b["node_id"]: (b["host"], b["port"]) for b in answer["brokers"]}
        assert brokers == expected
        (topic,) = answer["topics"]
        for partition in topic["partitions"]:
            record = records_of(cluster)[f"{TOPIC}-{partition['partition_index']}"]
            assert partition["error_code"] == 0
            assert partition["replica_nodes"] == [kafka_node_id(n) for n in record.replicas]
            assert sorted(partition["isr_nodes"]) == sorted(kafka_node_id(n) for n in record.isr)
    coordinators = {
        call(p.kafka_bootstrap, 10, 2, {"key": "kgroup", "key_type": 0})["node_id"]
        for _n, p in processes
    }
    assert len(coordinators) == 1
    (coordinator,) = coordinators
    others = [p for name, p in processes if kafka_node_id(name) != coordinator]
    heartbeat = {
        "group_id": "kgroup",
        "generation_id": 1,
        "member_id": "m",
        "group_instance_id": None,
    }
    assert call(others[0].kafka_bootstrap, 12, 3, heartbeat)["error_code"] == 16
    bootstraps = [p.kafka_bootstrap for _n, p in processes]
    assert produce(bootstraps[0], range(300)) == []
    got = consume_all(bootstraps[1], 300)
    assert sorted(got) == sorted(b"v%d" % n for n in range(300))


@pytest.mark.slow
def test_a_producer_goes_on_through_the_new_leaders_after_a_kill(cluster: Nodes) -> None:
    processes = list(cluster.running.items())
    bootstraps = ",".join(p.kafka_bootstrap for _n, p in processes)
    assert produce(bootstraps, range(200)) == []
    leaders = [r.leader for r in records_of(cluster).values()]
    victim = max(set(leaders), key=leaders.count)
    assert victim is not None
    cluster.running[victim].kill()
    survivors = [p for name, p in processes if name != victim]
    eventually(
        lambda: all(r.leader != victim for r in records_of(cluster).values()),
        60,
        POLL,
        what=f"new leaders for {victim}'s partitions",
    )
    assert produce(",".join(p.kafka_bootstrap for p in survivors), range(200, 400)) == []
    got = consume_all(survivors[0].kafka_bootstrap, 400)
    assert sorted(set(got)) == sorted(b"v%d" % n for n in range(400))
