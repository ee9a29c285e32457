"""A real cluster: one etcd and three ``python -m tqbroker --cluster-etcd`` processes on
127.0.0.1, .2 and .3, driven with pika. A stream declared on one node exists on all three and
gets three replicas; confirmed publishes (to the leader, and to a follower, which forwards
them) are read, in order, from each node's own replica; when the leader is killed with
``kill -9`` another in-sync replica leads at the next epoch with every confirmed message, and
takes new publishes from any node."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster_nodes import (
    declare_stream,
    publish,
    read_stream,
    three_nodes,
    wait_record,
)
from tests.support.etcd import EtcdProcess


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
