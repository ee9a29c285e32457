"""A real cluster: one etcd and three ``python -m tqbroker --cluster-etcd`` processes on
127.0.0.1, .2 and .3, driven with pika. A stream declared on one node exists on all three and
gets three replicas; confirmed publishes (to the leader, and to a follower, which forwards
them) are read, in order, from each node's own replica; when the leader is killed with
``kill -9`` another in-sync replica leads at the next epoch with every confirmed message, and
takes new publishes from any node; a tracked consumer whose node dies resumes on another node
right after its last ack."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.support.cluster_nodes import (
    channel,
    declare_stream,
    publish,
    read_stream,
    three_nodes,
    wait_record,
)
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually
from tqbroker.testing import BrokerProcess


def test_a_stream_replicated_on_three_processes_survives_its_leader_s_kill(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with three_nodes(tmp_path, etcd) as nodes:
        declare_stream(nodes.running["n0"])
        record = wait_record(nodes, lambda r: r.leader is not None and len(r.isr) == 3)
        assert sorted(record.replicas) == ["n0", "n1", "n2"]
        assert record.leader is not None
        leader = nodes.running[record.leader]
        first = [b"m%d" % n for n in range(100)]
        publish(leader, first[:50])
        follower = next(p for n, p in nodes.running.items() if n != record.leader)
        publish(follower, first[50:])  # forwarded to the leader, confirmed by its ISR
        for name, process in nodes.running.items():
            assert read_stream(process, 100) == first, name
        leader.kill()
        del nodes.running[record.leader]
        successor = wait_record(
            nodes, lambda r: r.leader not in (None, record.leader) and r.epoch > record.epoch
        )
        assert successor.leader in nodes.running
        survivor = next(p for n, p in nodes.running.items() if n != successor.leader)
        publish(survivor, [b"after"])
        for name, process in nodes.running.items():
            assert read_stream(process, 101) == [*first, b"after"], name


def read_tracked(process: BrokerProcess, count: int, *, ack: int) -> list[bytes]:
    """``count`` bodies read by the tracked consumer ``reader-1`` on ``process``, the first
    ``ack`` of them acked."""
    ch = channel(process)
    ch.basic_qos(prefetch_count=count)
    arguments = {"x-stream-automatic-offset-tracking": True, "x-stream-offset": "first"}
    bodies: list[bytes] = []
    for method, _properties, body in ch.consume(
        "s", arguments=arguments, consumer_tag="reader-1", inactivity_timeout=20
    ):
        assert method is not None, f"only {len(bodies)} read"
        bodies.append(body)
        if len(bodies) <= ack:
            ch.basic_ack(method.delivery_tag)
        if len(bodies) == count:
            break
    ch.connection.close()
    return bodies


def test_a_tracked_consumer_whose_node_dies_resumes_on_another_after_its_last_ack(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with three_nodes(tmp_path, etcd) as nodes:
        declare_stream(nodes.running["n0"])
        record = wait_record(nodes, lambda r: r.leader is not None and len(r.isr) == 3)
        bodies = [b"m%d" % n for n in range(100)]
        publish(nodes.running["n0"], bodies)
        home, elsewhere = (n for n in sorted(nodes.running) if n != record.leader)
        assert read_tracked(nodes.running[home], 41, ack=40) == bodies[:41]
        # The acks' offset goes to the leader, and from it to every replica (read there
        # without an ack: that moves nothing).
        resumes = functools.partial(read_tracked, nodes.running[elsewhere], 1, ack=0)
        eventually(lambda: resumes() == bodies[40:41], 30, 0.2, what="the offset replicated")
        nodes.running.pop(home).kill()
        assert read_tracked(nodes.running[elsewhere], 10, ack=10) == bodies[40:50]
