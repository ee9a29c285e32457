"""Faults of the links on a real three-node cluster under load (``cluster_topic``): a topic of
three partitions, a pika publisher on every node, the history checked at the end (no confirmed
message lost or reordered, replicas agreeing below the high watermark). The design's failure
cases (``shared/reference/scaleout.md``):

- a leader cut from etcd (a test-owned TCP proxy between each node and etcd, ``tcp_proxy``):
  its lease runs out, it stops confirming, another in-sync replica leads at a later epoch;
  healed, it follows and catches up;
- a leader paused (``SIGSTOP``) past its lease, then resumed: another leads meanwhile; back, the
  old one confirms nothing in its old epoch and follows;
- a leader cut from its followers (a proxy in front of each node's link, the address the node
  advertises): they cannot fetch, its ISR shrinks below ``min-insync-replicas`` (2), so it
  nacks and the high watermark stays (Kafka's NOT_ENOUGH_REPLICAS); healed, the ISR grows back
  and confirms go on;
- etcd down (killed) and back: nothing can be elected meanwhile; a restart resets every
  lease's TTL, so the nodes that kept running keep their registrations or register again, the
  partitions are led again and confirms go on.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.support.cluster_nodes import HOSTS, POLL, Nodes
from tests.support.cluster_topic import SETTLE, Topic, checked_load
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.tcp_proxy import TcpProxy, running_proxy
from tqbroker.cluster.records import PartitionRecord

PARTITIONS = 3
LEASE_TTL = 3

pytestmark = pytest.mark.timeout(300)


@contextmanager
def cluster(
    tmp_path: Path, etcd: EtcdProcess, *, etcd_proxies: bool = False, peer_proxies: bool = False
) -> Iterator[tuple[Nodes, dict[str, TcpProxy]]]:
    """Three nodes, each behind a proxy of its own to etcd, or in front of its link (the
    proxies by node name), all killed at the end."""
    nodes = Nodes(tmp_path, etcd)
    nodes.config.write_text(f"cluster_lease_ttl = {LEASE_TTL}\n")
    proxies: dict[str, TcpProxy] = {}
    with ExitStack() as stack:
        stack.callback(nodes.stop_all)
        for n in range(3):
            name = f"n{n}"
            if etcd_proxies:
                proxy = proxies[name] = stack.enter_context(
                    running_proxy("127.0.0.1", etcd.client_port)
                )
                nodes.start(n, etcd_url=f"http://{proxy.address}")
            elif peer_proxies:
                port = free_port(HOSTS[n])  # its link listens on its host
                proxy = proxies[name] = stack.enter_context(
                    running_proxy(HOSTS[n], port, host=HOSTS[n])  # where it is advertised
                )
                nodes.start(n, peer_port=port, advertise_peer_port=proxy.port)
            else:
                nodes.start(n)
        yield nodes, proxies


def first_leader(topic: Topic) -> PartitionRecord:
    record = topic.wait_led("every partition led")[topic.queues[0]]
    assert record.leader is not None
    return record


def led_elsewhere(topic: Topic, old: PartitionRecord) -> PartitionRecord | None:
    record = topic.nodes.record(topic.queues[0])
    if record is None or record.leader in (None, old.leader):
        return None
    return record if record.epoch > old.epoch else None


def test_a_leader_cut_from_etcd_gives_way_and_loses_nothing(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with (
        cluster(tmp_path, etcd, etcd_proxies=True) as (nodes, proxies),
        checked_load(nodes, PARTITIONS) as (topic, load),
    ):
        old = first_leader(topic)
        assert old.leader is not None
        proxies[old.leader].cut()
        eventually(lambda: led_elsewhere(topic, old), SETTLE, POLL, what="a new leader")
        load.wait_progress(f"confirms with {old.leader} cut from etcd")
        proxies[old.leader].heal()
        topic.wait_in_sync(f"{old.leader} back in sync")


def test_a_paused_leader_resumes_as_a_follower_and_loses_nothing(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with (
        cluster(tmp_path, etcd) as (nodes, _proxies),
        checked_load(nodes, PARTITIONS) as (topic, load),
    ):
        old = first_leader(topic)
        assert old.leader is not None
        paused = nodes.running[old.leader].proc.pid
        os.kill(paused, signal.SIGSTOP)
        try:
            eventually(lambda: led_elsewhere(topic, old), SETTLE, POLL, what="a new leader")
            load.wait_progress(f"confirms with {old.leader} paused")
        finally:
            os.kill(paused, signal.SIGCONT)
        topic.wait_in_sync(f"{old.leader} back in sync")


def test_a_leader_cut_from_its_followers_nacks_until_healed(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with (
        cluster(tmp_path, etcd, peer_proxies=True) as (nodes, proxies),
        checked_load(nodes, PARTITIONS) as (topic, _load),
    ):
        old = first_leader(topic)
        assert old.leader is not None
        proxies[old.leader].cut()  # nobody fetches from it; its own fetches still go out

        def shrunk() -> PartitionRecord | None:
            record = nodes.record(topic.queues[0])
            return record if record is not None and list(record.isr) == [old.leader] else None

        eventually(shrunk, SETTLE, POLL, what=f"the ISR of {topic.queues[0]} down to its leader")
        proxies[old.leader].heal()
        topic.wait_in_sync("the ISR grown back")


def lease_lost(tmp_path: Path, name: str) -> bool:
    """The node's log says its lease is lost (``membership.py``)."""
    return (
        re.search(rf"node {name}: lease \w+ lost", (tmp_path / f"{name}.log").read_text())
        is not None
    )


def test_etcd_down_and_back_loses_nothing(tmp_path: Path, etcd: EtcdProcess) -> None:
    with (
        cluster(tmp_path, etcd) as (nodes, _proxies),
        checked_load(nodes, PARTITIONS) as (topic, _load),
    ):
        etcd.stop()
        try:
            # Longer than a lease: every node's registration has run out by its own clock.
            eventually(
                lambda: all(lease_lost(tmp_path, name) for name in nodes.running),
                SETTLE,
                POLL,
                what="every node to notice its lease is gone",
            )
        finally:
            etcd.start()
        topic.wait_in_sync("the partitions led and in sync again")
