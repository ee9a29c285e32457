"""Issue 30's "done when" on real processes: one etcd and three brokers on 127.0.0.1, .2 and .3,
a topic of six partitions, a pika publisher on every node (confirms on, one message in flight,
round robin over the partitions: forwarded to the leaders elsewhere) while each node in turn is
killed with ``kill -9`` and restarted on its data directory: a leader (of partition 0), the
controller, then a follower (of the nodes not killed yet in the round, the one leading the
fewest partitions). Every kill must leave the
publishers confirming on the two others; after the last restart every partition is back to three
in-sync replicas at one high watermark, and the history passes the checker
(``tests/support/cluster_history.py``): no confirmed message lost or reordered, no duplicate of
one confirmed the first time, offsets unique, replicas agreeing record for record below the high
watermark (read over each node's HTTP API: byte-identical frames are checked by the in-process
runs, which can see the logs).

By default the three kills run once; ``-m slow`` runs them three times over.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.support.cluster_nodes import POLL, Nodes, three_nodes
from tests.support.cluster_topic import SETTLE, Topic, checked_load
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually

PARTITIONS = 6


def victim(nodes: Nodes, topic: Topic, role: str, killed: list[str]) -> str:
    """The node to kill for ``role``; the follower is one not killed yet in this round."""
    placed = topic.wait_led("every partition led")
    if role == "leader":
        leader = placed[topic.queues[0]].leader
        assert leader is not None
        return leader
    if role == "controller":
        return eventually(nodes.controller, SETTLE, POLL, what="a controller")
    leading = Counter(record.leader for record in placed.values())
    spared = [name for name in sorted(nodes.running) if name not in killed] or sorted(nodes.running)
    return min(spared, key=lambda name: leading[name])


def run_kills(tmp_path: Path, etcd: EtcdProcess, rounds: int) -> None:
    with three_nodes(tmp_path, etcd) as nodes, checked_load(nodes, PARTITIONS) as (topic, load):
        killed: list[str] = []
        for role in ("leader", "controller", "follower") * rounds:
            killed = [] if role == "leader" else killed
            name = victim(nodes, topic, role, killed)
            killed.append(name)
            print(f"kill -9 {name} ({role})")
            nodes.running.pop(name).kill()
            since = load.confirmed
            topic.wait_led(f"leaders after {name}")
            load.wait_progress(f"confirms with {name} down", since)
            nodes.start(int(name[1:]))
            topic.wait_in_sync(f"{name} back in sync")


@pytest.mark.timeout(300)
def test_killing_a_leader_the_controller_and_a_follower_loses_no_confirmed_message(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    run_kills(tmp_path, etcd, rounds=1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killing_each_node_three_times_over_loses_no_confirmed_message(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    run_kills(tmp_path, etcd, rounds=3)
