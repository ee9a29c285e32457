"""Cluster benchmark: does confirmed stream publishing grow with broker processes?

    PYTHONPATH=.:src python benchmarks/cluster.py [--streams 3] [--count 50000] [--size 100]
                                                  [--window 500] [--scenarios 1,2,3,4,5]

Each scenario starts its own brokers (``python -m tqbroker``, log backend, on 127.0.0.1-3) and,
for a cluster, its own etcd (``tests/support/etcd.py``: Debian's etcd on ephemeral loopback
ports, hence ``PYTHONPATH=.``), declares ``--streams`` stream queues, and runs one publisher
process per stream (``rawclient.py``, ``--window`` confirms outstanding, ``--count`` messages
of ``--size`` bytes, after a short warm-up), all released at once:

1. one node alone (no cluster), every stream published to it;
2. one node in a cluster (etcd, ``x-stream-replicas`` 1): the cluster's own overhead;
3. three nodes, replicas 1, the controller spreading leaders; each stream published to its
   leader's node (found in the stream's partition record in etcd);
4. three nodes, replicas 3 (every node stores every stream), published to the leaders;
5. three nodes, replicas 3, each stream published to a node that does not lead it (the
   publish is forwarded to the leader over the node-to-node link).

Prints, per scenario, the confirmed publish rate of all publishers together (messages over the
time from the first publisher's start to the last one's end), where the leaders are, and the CPU
seconds (user + system) that each broker process, etcd, the publishers together and the whole
machine (``/proc/stat``: anything else running shows there) used in the timed phase, with the
brokers' CPU per message. A benchmark, not a test: it asserts nothing. Each wait is bounded
(``--timeout`` per scenario's publishing, a minute for a cluster to settle).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import TypeVar

import trio
from procstats import cpu_seconds, machine_cpu_seconds
from rawclient import BrokerError, Endpoint, RawClient
from tests.support.etcd import EtcdProcess, running_etcd, system_etcd_binary

from tqbroker.cluster.etcd import EtcdClient
from tqbroker.cluster.records import (
    DEFAULT_PREFIX,
    PartitionRecord,
    nodes_prefix,
    partition_key,
)
from tqbroker.protocol.codec import FieldTable
from tqbroker.testing import BrokerProcess, start_broker_process

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
WARM_UP = 200  # confirmed messages per publisher before the timed phase
SETTLE_TIMEOUT = 60.0  # for nodes to register, leaders to be elected, definitions to arrive

T = TypeVar("T")


@dataclass(frozen=True)
class Scenario:
    number: int
    title: str
    nodes: int
    replicas: int | None  # None: no cluster
    to_leader: bool = True


SCENARIOS = (
    Scenario(1, "1 node, no cluster", 1, None),
    Scenario(2, "1 node, cluster, replicas 1", 1, 1),
    Scenario(3, "3 nodes, replicas 1, to leaders", 3, 1),
    Scenario(4, "3 nodes, replicas 3, to leaders", 3, 3),
    Scenario(5, "3 nodes, replicas 3, to a non-leader", 3, 3, to_leader=False),
)


@dataclass(frozen=True)
class Load:
    streams: int
    count: int
    size: int
    window: int
    timeout: float


@dataclass(frozen=True)
class Outcome:
    rate: float  # confirmed msg/s, all publishers together
    seconds: float
    leaders: dict[str, str]  # stream -> the node leading it
    broker_cpu: dict[str, float]  # node -> CPU seconds in the timed phase
    etcd_cpu: float | None
    publishers_cpu: float  # all publisher processes together, in their timed phase
    machine_busy: float  # the whole machine's busy CPU seconds over the timed phase's
    errors: list[str]


@dataclass(frozen=True)
class Published:
    """A publisher's timed phase: ``perf_counter()`` at its start and end, its CPU seconds."""

    start: float
    end: float
    cpu: float


@dataclass(frozen=True)
class Failed:
    stream: str
    error: str


# -- the publishers (child processes) -------------------------------------------------------


def publisher(
    endpoint: Endpoint,
    stream: str,
    load: Load,
    start_together: Barrier,
    results: multiprocessing.Queue[Published | Failed],
) -> None:
    """Warm up (nacks, while a leader settles, are sent again), wait for the others, then
    publish ``load.count`` confirmed messages; put what it did on ``results``."""
    try:
        client = warmed_up(endpoint, stream, load)
        start_together.wait(timeout=SETTLE_TIMEOUT)
        # perf_counter() is CLOCK_MONOTONIC: the parent compares it between processes.
        cpu, start = time.process_time(), time.perf_counter()
        client.publish_confirmed(stream, b"x" * load.size, load.count, window=load.window)
        results.put(Published(start, time.perf_counter(), time.process_time() - cpu))
        client.close()
    except Exception as exc:  # reported by the parent, which asserts nothing
        results.put(Failed(stream, f"{type(exc).__name__}: {exc}"))
        start_together.abort()


def warmed_up(endpoint: Endpoint, stream: str, load: Load) -> RawClient:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        client = RawClient.connect(endpoint, timeout=load.timeout)
        try:
            client.publish_confirmed(stream, b"x" * load.size, WARM_UP, window=load.window)
            return client
        except BrokerError:
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# -- brokers and etcd -----------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    name: str
    process: BrokerProcess

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.process.host, self.process.port)

    @property
    def pid(self) -> int:
        return self.process.proc.pid


@contextmanager
def brokers(scenario: Scenario, root: Path, etcd: EtcdProcess | None) -> Iterator[list[Node]]:
    """The scenario's broker processes (killed on exit), their logs in ``root``."""
    nodes: list[Node] = []
    try:
        for n in range(scenario.nodes):
            name = f"n{n + 1}"
            args = ["--host", HOSTS[n]]
            if etcd is not None:
                args += ["--peer-port", "0", "--cluster-etcd", etcd.url, "--node-id", name]
            process = start_broker_process(
                root / name,
                durable_backend="log",
                extra_args=args,
                stderr=root / f"{name}.log",
                timeout=SETTLE_TIMEOUT,
            )
            nodes.append(Node(name, process))
        yield nodes
    finally:
        for node in nodes:
            node.process.kill()


def etcd_read(etcd: EtcdProcess, read: Callable[[EtcdClient], Awaitable[T]]) -> T:
    async def run() -> T:
        client = EtcdClient([etcd.url])
        try:
            return await read(client)
        finally:
            await client.aclose()

    return trio.run(run)


def registered_nodes(etcd: EtcdProcess) -> int:
    async def count(client: EtcdClient) -> int:
        return len((await client.get(nodes_prefix(DEFAULT_PREFIX), prefix=True)).kvs)

    return etcd_read(etcd, count)


def partition(etcd: EtcdProcess, stream: str) -> PartitionRecord | None:
    async def get(client: EtcdClient) -> PartitionRecord | None:
        found = await client.get(partition_key(DEFAULT_PREFIX, "/", stream))
        return PartitionRecord.decode(found.kvs[0].value) if found.kvs else None

    return etcd_read(etcd, get)


def wait_until(what: str, probe: Callable[[], T | None]) -> T:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while (found := probe()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {SETTLE_TIMEOUT:g} s: {what}")
        time.sleep(0.1)
    return found


def settled_leader(etcd: EtcdProcess, stream: str, replicas: int) -> str:
    """The stream's leader once it has one and all ``replicas`` are in sync."""

    def probe() -> str | None:
        record = partition(etcd, stream)
        if record is None or record.leader is None or len(record.isr) < replicas:
            return None
        return record.leader

    return wait_until(f"{stream} led with {replicas} in sync", probe)


def declare_streams(
    scenario: Scenario, nodes: Sequence[Node], etcd: EtcdProcess | None, streams: Sequence[str]
) -> dict[str, str]:
    """Declare the streams on the first node, one at a time (so that the controller places
    each knowing the ones before); each stream's leader, by node name."""
    if etcd is not None:
        wait_until(
            f"{len(nodes)} nodes registered",
            lambda: True if registered_nodes(etcd) >= len(nodes) else None,
        )
    arguments: FieldTable = {"x-queue-type": "stream"}
    if scenario.replicas is not None:
        arguments["x-stream-replicas"] = scenario.replicas
    client = RawClient.connect(nodes[0].endpoint)
    leaders: dict[str, str] = {}
    for stream in streams:
        client.declare(stream, arguments)
        leaders[stream] = (
            nodes[0].name
            if etcd is None or scenario.replicas is None
            else settled_leader(etcd, stream, scenario.replicas)
        )
    client.close()
    return leaders


def target(scenario: Scenario, nodes: Sequence[Node], leader: str) -> Node:
    """The node a stream's publisher connects to: its leader's, or the next one's."""
    index = next(i for i, node in enumerate(nodes) if node.name == leader)
    return nodes[index if scenario.to_leader else (index + 1) % len(nodes)]


def wait_for_definition(node: Node, stream: str) -> None:
    def probe() -> bool | None:
        client = RawClient.connect(node.endpoint)
        try:
            client.message_count(stream)
            return True
        except BrokerError:
            return None
        finally:
            client.close()

    wait_until(f"{stream} declared on {node.name}", probe)


# -- a scenario -----------------------------------------------------------------------------


def run(scenario: Scenario, load: Load, root: Path) -> Outcome:
    streams = [f"bench-{i + 1}" for i in range(load.streams)]
    with ExitStack() as stack:
        etcd = None
        if scenario.replicas is not None:
            binary = system_etcd_binary()
            if binary is None:
                raise RuntimeError("no etcd: apt-get install etcd-server")
            etcd = stack.enter_context(running_etcd(binary))
        nodes = stack.enter_context(brokers(scenario, root, etcd))
        leaders = declare_streams(scenario, nodes, etcd, streams)
        targets = {stream: target(scenario, nodes, leaders[stream]) for stream in streams}
        for stream, node in targets.items():
            wait_for_definition(node, stream)
        context = multiprocessing.get_context("spawn")
        start_together = context.Barrier(len(streams) + 1)
        results: multiprocessing.Queue[Published | Failed] = context.Queue()
        workers = [
            context.Process(
                target=publisher,
                args=(targets[s].endpoint, s, load, start_together, results),
                daemon=True,
            )
            for s in streams
        ]
        for worker in workers:
            worker.start()
        errors: list[str] = []
        # A broken barrier: a publisher failed to warm up (its error is on the queue).
        with contextlib.suppress(threading.BrokenBarrierError):
            start_together.wait(timeout=SETTLE_TIMEOUT)
        cpu_before = {node.name: cpu_seconds(node.pid) or 0.0 for node in nodes}
        etcd_before = cpu_seconds(etcd.proc.pid if etcd and etcd.proc else None)
        machine_before = machine_cpu_seconds()
        spans: list[Published] = []
        deadline = time.monotonic() + load.timeout
        for _ in streams:
            try:
                result = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                errors.append(f"not all publishers finished within {load.timeout:g} s")
                break
            if isinstance(result, Published):
                spans.append(result)
            else:
                errors.append(f"{result.stream}: {result.error}")
        machine_after = machine_cpu_seconds()
        cpu_after = {node.name: cpu_seconds(node.pid) or 0.0 for node in nodes}
        etcd_after = cpu_seconds(etcd.proc.pid if etcd and etcd.proc else None)
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
        seconds = max(p.end for p in spans) - min(p.start for p in spans) if spans else 0.0
        return Outcome(
            rate=len(spans) * load.count / seconds if seconds else 0.0,
            seconds=seconds,
            leaders=leaders,
            broker_cpu={n: cpu_after[n] - cpu_before[n] for n in cpu_before},
            etcd_cpu=etcd_after - etcd_before
            if etcd_after is not None and etcd_before is not None
            else None,
            publishers_cpu=sum(p.cpu for p in spans),
            machine_busy=machine_after - machine_before,
            errors=errors,
        )


def report(scenario: Scenario, load: Load, outcome: Outcome) -> None:
    placed = ", ".join(f"{s}@{n}" for s, n in outcome.leaders.items())
    cpu = "  ".join(f"{n} {c:.1f}" for n, c in outcome.broker_cpu.items())
    total_cpu = sum(outcome.broker_cpu.values())
    messages = load.streams * load.count
    etcd = f"  etcd {outcome.etcd_cpu:.1f}" if outcome.etcd_cpu is not None else ""
    print(f"{scenario.number}. {scenario.title}  (leaders: {placed})")
    print(
        f"   {outcome.rate:>9,.0f} msg/s in {outcome.seconds:.1f} s;"
        f"  CPU s: {cpu}{etcd}  publishers {outcome.publishers_cpu:.1f}"
        f"  machine {outcome.machine_busy:.1f};  brokers {total_cpu / messages * 1e6:.0f} µs/msg",
        flush=True,
    )
    for error in outcome.errors:
        print(f"   error: {error}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--count", type=int, default=50_000, help="messages per stream")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=120.0, help="per scenario's publishing")
    parser.add_argument("--scenarios", default="1,2,3,4,5")
    args = parser.parse_args()
    load = Load(args.streams, args.count, args.size, args.window, args.timeout)
    chosen = {int(n) for n in args.scenarios.split(",")}
    print(
        f"{load.streams} streams x {load.count:,} confirmed messages of {load.size} B, window"
        f" {load.window}, a publisher process each; {os.cpu_count()} cores,"
        f" load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    for scenario in SCENARIOS:
        if scenario.number in chosen:
            with tempfile.TemporaryDirectory(prefix="tqbroker-bench-cluster-") as root:
                report(scenario, load, run(scenario, load, Path(root)))


if __name__ == "__main__":
    main()
