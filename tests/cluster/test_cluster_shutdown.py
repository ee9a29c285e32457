"""A controlled shutdown (SIGTERM) on a real cluster: the leader's node leaves, another in-sync
replica leads well before the leader's lease could have run out (60 s here: without the
controlled shutdown the election would wait for it), the process exits 0, and every confirmed
message is on the new leader."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.cluster_nodes import (
    declare_stream,
    publish,
    read_stream,
    three_nodes,
    wait_record,
)
from tests.support.etcd import EtcdProcess

LEASE_TTL = 60


def test_sigterm_moves_the_leadership_before_the_lease_runs_out(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with three_nodes(tmp_path, etcd, lease_ttl=LEASE_TTL) as nodes:
        declare_stream(nodes.running["n1"])
        record = wait_record(nodes, lambda r: r.leader is not None and len(r.isr) == 3)
        assert record.leader is not None
        bodies = [b"m%d" % n for n in range(30)]
        publish(nodes.running[record.leader], bodies)
        leaving = nodes.running.pop(record.leader)
        asked = time.monotonic()
        assert leaving.stop() == 0  # SIGTERM: a graceful exit
        successor = wait_record(
            nodes,
            lambda r: r.leader not in (None, record.leader) and r.epoch > record.epoch,
            timeout=LEASE_TTL / 2,
        )
        assert time.monotonic() - asked < LEASE_TTL / 2
        assert successor.leader is not None
        assert record.leader not in successor.isr
        assert read_stream(nodes.running[successor.leader], 30) == bodies
