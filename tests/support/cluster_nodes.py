"""Real cluster nodes for tests: ``python -m tqbroker --cluster-etcd`` processes on 127.0.0.1,
.2 and .3 (``Nodes``), each with its own data directory and log under the test's directory, a
lease TTL of 3 s; a stream's partition record and the controller read from etcd
(``Nodes.record``, ``wait_record``, ``Nodes.controller``), and a pika channel to a node
(``channel``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import trio

from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually
from tqbroker.cluster.etcd import EtcdClient
from tqbroker.cluster.records import (
    DEFAULT_PREFIX,
    ControllerRecord,
    PartitionRecord,
    controller_key,
    partition_key,
)
from tqbroker.testing import BrokerProcess, start_broker_process

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
STREAM = {"x-queue-type": "stream"}
POLL = 0.2  # seconds between two looks at etcd or a node


class Nodes:
    def __init__(self, tmp_path: Path, etcd: EtcdProcess) -> None:
        self.tmp_path = tmp_path
        self.etcd = etcd
        self.config = tmp_path / "cluster.toml"
        self.config.write_text("cluster_lease_ttl = 3\n")
        self.running: dict[str, BrokerProcess] = {}

    def start(
        self,
        n: int,
        *,
        etcd_url: str | None = None,
        peer_port: int = 0,
        advertise_peer_port: int | None = None,
    ) -> BrokerProcess:
        """Node ``n`` on ``etcd_url`` (default: the test's etcd), its link on ``peer_port``
        (0: ephemeral), reached by the others on ``advertise_peer_port`` (a proxy's)."""
        name = f"n{n}"
        advertised = [] if advertise_peer_port is None else [str(advertise_peer_port)]
        process = start_broker_process(
            self.tmp_path / name,
            durable_backend="log",
            extra_args=[
                "--config",
                str(self.config),
                "--host",
                HOSTS[n],
                "--peer-port",
                str(peer_port),
                *(["--advertise-peer-port", *advertised] if advertised else []),
                "--cluster-etcd",
                etcd_url or self.etcd.url,
                "--node-id",
                name,
            ],
            stderr=self.tmp_path / f"{name}.log",
            log_level="INFO",
            timeout=60,
        )
        self.running[name] = process
        return process

    def stop_all(self) -> None:
        for process in self.running.values():
            process.kill()

    def record(self, queue: str = "s") -> PartitionRecord | None:
        found = self._value(partition_key(DEFAULT_PREFIX, "/", queue))
        return PartitionRecord.decode(found) if found is not None else None

    def controller(self) -> str | None:
        """The node holding the controller key, if any."""
        found = self._value(controller_key(DEFAULT_PREFIX))
        return ControllerRecord.decode(found).node if found is not None else None

    def _value(self, key: str) -> bytes | None:
        async def read() -> bytes | None:
            client = EtcdClient([self.etcd.url])
            try:
                found = await client.get(key)
            finally:
                await client.aclose()
            return found.kvs[0].value if found.kvs else None

        return trio.run(read)


def partition_records(nodes: Nodes, topic: str, partitions: int) -> dict[str, PartitionRecord]:
    """The partition records of a topic's stream queues that exist, by queue name."""
    found = {}
    for n in range(partitions):
        record = nodes.record(f"{topic}-{n}")
        if record is not None:
            found[f"{topic}-{n}"] = record
    return found


def wait_record(
    nodes: Nodes,
    check: Callable[[PartitionRecord], bool],
    timeout: float = 60,
    queue: str = "s",
) -> PartitionRecord:
    """The stream's partition record once ``check`` holds for it."""

    def checked() -> PartitionRecord | None:
        found = nodes.record(queue)
        return found if found is not None and check(found) else None

    return eventually(checked, timeout, POLL, what=f"the partition record of {queue}")


@contextmanager
def three_nodes(tmp_path: Path, etcd: EtcdProcess, *, lease_ttl: int = 3) -> Iterator[Nodes]:
    """Three nodes started (n0, n1, n2), all killed at the end."""
    nodes = Nodes(tmp_path, etcd)
    nodes.config.write_text(f"cluster_lease_ttl = {lease_ttl}\n")
    try:
        for n in range(3):
            nodes.start(n)
        yield nodes
    finally:
        nodes.stop_all()


def declare_stream(
    process: BrokerProcess, queue: str = "s", arguments: dict[str, Any] | None = None
) -> None:
    """A durable stream queue declared over AMQP on ``process``."""
    ch = channel(process)
    ch.queue_declare(queue, durable=True, arguments={**STREAM, **(arguments or {})})
    ch.connection.close()


def channel(process: BrokerProcess) -> Any:
    connection = pika.BlockingConnection(pika.URLParameters(process.url))
    return connection.channel()


def read_stream(process: BrokerProcess, count: int, queue: str = "s") -> list[bytes]:
    """The first ``count`` bodies of the stream, read from this node's replica."""
    ch = channel(process)
    try:
        ch.basic_qos(prefetch_count=100)
        bodies: list[bytes] = []
        for _method, _properties, body in ch.consume(
            queue, arguments={"x-stream-offset": "first"}, inactivity_timeout=20
        ):
            if body is None:
                break
            bodies.append(body)
            ch.basic_ack(_method.delivery_tag)
            if len(bodies) == count:
                break
        return bodies
    finally:
        ch.connection.close()


def publish(process: BrokerProcess, bodies: list[bytes], queue: str = "s") -> None:
    """Publish each body with confirms, sending a nacked one again (as a client does while a
    new leader takes over) for up to 30 s."""
    ch = channel(process)
    try:
        ch.confirm_delivery()
        for body in bodies:
            deadline = time.monotonic() + 30
            while True:
                try:
                    ch.basic_publish("", queue, body, mandatory=True)
                    break
                except pika.exceptions.NackError:
                    assert time.monotonic() < deadline, f"{body!r} nacked for 30 s"
                    time.sleep(0.2)
    finally:
        ch.connection.close()
