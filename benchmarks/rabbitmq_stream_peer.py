"""RabbitMQ's native stream protocol as a peer for tqbroker's stream numbers (issue 31, item 6).

    cd benchmarks && PYTHONPATH=..:../src python rabbitmq_stream_peer.py \\
        [--count 200000] [--size 100] [--batch 1000] [--window 20000] [--client rstream]

What it measures: ``measure_rabbitmq_stream(count, size)`` starts a private RabbitMQ node (Debian's
``rabbitmq-server``, 3.10.8 here) on loopback the way ``targets.RabbitMQTarget`` does (its own
ports, node name, mnesia, logs and Erlang cookie under a temporary directory) with the
``rabbitmq_stream`` plugin listening on an ephemeral 127.0.0.1 port (``stream.listeners.tcp.1``,
advertised as ``stream.advertised_host``/``stream.advertised_port`` = that address, so that the
client's metadata lookup sends it back to the same socket address). It declares a stream, then:

- produce: publishes ``count`` messages of ``size`` random bytes (raw, no AMQP 1.0 envelope) in
  Publish frames of ``batch`` messages, keeping up to ``window`` messages unconfirmed, and stops
  the clock when the last publish confirm has arrived;
- consume: subscribes from offset ``first`` and stops the clock at the ``count``-th message.

Each phase reports messages per second, the broker's CPU per message (utime + stime of the
node's ``beam.smp``, found by the stream port, over the phase, divided by ``count``) and the
client's (``time.process_time()`` of this process), so the table can say who the limit was.

What a confirm means here: on the stream protocol the broker confirms a publish once the stream's
writer has written the chunk to its segment file and, in a cluster, a quorum of the stream's
replicas has it; a single node is its own quorum. Streams never fsync: RabbitMQ's documentation
("Data Safety when using Streams") says they leave the data in the OS page cache for the kernel
to write out, so a power loss or kernel crash can lose confirmed messages on that node (a
``kill -9`` of the broker cannot). tqbroker's stream path confirms after fsync, so its confirm
promises more: compare the rates with that in mind.

Which side limits the run: the client. rstream (RabbitMQ's own Python stream client, pure Python,
asyncio) spends 4-6 µs of Python per published message (it builds a message object per message
and calls the confirm callback once per message) and ~2 µs per consumed one, against ~2-3 and
~0.5-1 µs in the broker; on this 2-core machine the client process runs at 75-100 % of a core
while the broker's ``beam.smp`` stays at 30-50 %. So the rates are a lower bound on what
RabbitMQ's stream protocol can do; its CPU µs per message are the broker's real cost (they
include what Erlang's schedulers spend busy-waiting between bursts, as any RabbitMQ run does).
RbFly 0.10 (Cython codecs, a binary batch publisher with one frame in flight per publisher) was
measured too and was slower here (~6 µs of client CPU per message both ways), so rstream is the
one client kept. Each line printed gives both
processes' share of a core and an estimate of what everything else on the machine used
(``/proc/stat`` less the two; tick-based, rough over a phase under a second): a busy machine
shows there.

A benchmark, not a test: it asserts only that every message was confirmed and read back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from procstats import cpu_seconds, machine_cpu_seconds, pid_listening_on, wait_for_idle
from targets import Epmd, RabbitMQTarget, rabbit_script

STREAM = "tqbench-stream-peer"
TIMEOUT = 600.0  # seconds for the whole run: node start, produce, consume, stop
START_TIMEOUT = 120.0
USER = PASSWORD = "guest"  # loopback_users.guest = true: guest may log in over 127.0.0.1 only


@dataclass(frozen=True)
class StreamNode:
    """A running private node: where its stream listener is and which process is the broker."""

    port: int
    pid: int  # beam.smp
    version: str


@dataclass(frozen=True)
class Phase:
    """One side of the run: how long it took and the CPU spent by the broker and this client."""

    seconds: float
    broker_cpu: float
    client_cpu: float
    machine_cpu: float  # every process's, so that what else ran meanwhile shows


@contextlib.contextmanager
def rabbitmq_stream_node(root: Path) -> Iterator[StreamNode]:
    """A private RabbitMQ node under ``root`` with ``rabbitmq_stream`` on an ephemeral loopback
    port (advertised as that host and port); stopped, and its epmd if we started it, at the end."""
    server, ctl = rabbit_script("rabbitmq-server"), rabbit_script("rabbitmqctl")
    if server is None or ctl is None:
        raise RuntimeError("needs RabbitMQ: apt-get install rabbitmq-server")
    epmd = Epmd()
    target = RabbitMQTarget(root / "node", server, ctl, epmd=epmd)
    port = _free_port()
    (target.root / "enabled_plugins").write_text("[rabbitmq_stream].\n")
    with open(target.root / "rabbitmq.conf", "a") as conf:
        conf.write(
            f"stream.listeners.tcp.1 = 127.0.0.1:{port}\n"
            "stream.advertised_host = 127.0.0.1\n"
            f"stream.advertised_port = {port}\n"
        )
    if os.geteuid() == 0:  # Debian's scripts run the node as the rabbitmq user
        subprocess.run(["chown", "-R", "rabbitmq", str(root)], check=False)
    try:
        target.start(timeout=START_TIMEOUT)
        deadline = time.monotonic() + 60
        pid = pid_listening_on(port)
        while pid is None and time.monotonic() < deadline:  # the plugin's listener comes last
            time.sleep(0.2)
            pid = pid_listening_on(port)
        if pid is None:
            raise RuntimeError(f"nothing listens on the stream port {port}")
        if pid != target.pid:
            raise RuntimeError(f"stream port {port} is served by {pid}, not beam {target.pid}")
        yield StreamNode(port, pid, target.version())
    finally:
        target.close()
        epmd.cleanup()


# -- clients -----------------------------------------------------------------------------------

# A client runs one phase and returns its elapsed seconds; the caller samples CPU around it.
Produce = Callable[[int, list[bytes], int, int], Awaitable[float]]
Consume = Callable[[int, int], Awaitable[float]]


async def rstream_produce(port: int, messages: list[bytes], batch: int, window: int) -> float:
    """Publish ``messages`` with rstream's ``Producer.send_batch`` (one Publish frame per batch),
    at most ``window`` unconfirmed; the seconds until the last confirm."""
    from rstream import ConfirmationStatus, Producer

    confirmed = 0
    failed: list[int] = []
    progress = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed
        confirmed += 1
        if not status.is_confirmed:
            failed.append(status.response_code)
        progress.set()

    async with Producer("127.0.0.1", port, username=USER, password=PASSWORD) as producer:
        await producer.create_stream(STREAM, exists_ok=True)
        start = time.perf_counter()
        for first in range(0, len(messages), batch):
            while first - confirmed > window - batch:
                progress.clear()
                await progress.wait()
            await producer.send_batch(
                STREAM, messages[first : first + batch], on_publish_confirm=on_confirm
            )
        while confirmed < len(messages):
            progress.clear()
            await progress.wait()
        elapsed = time.perf_counter() - start
    if failed:
        raise RuntimeError(f"{len(failed)} publishes refused (codes {sorted(set(failed))})")
    return elapsed


async def rstream_consume(port: int, count: int) -> float:
    """Read the stream from ``first`` with rstream's ``Consumer``; the seconds to ``count``."""
    from rstream import Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType

    received = 0
    done = asyncio.Event()

    def on_message(message: object, context: MessageContext) -> None:
        nonlocal received
        received += 1
        if received >= count:
            done.set()

    consumer = Consumer("127.0.0.1", port, username=USER, password=PASSWORD)
    await consumer.start()
    try:
        start = time.perf_counter()
        await consumer.subscribe(
            STREAM,
            on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
            initial_credit=32,
        )
        await done.wait()
        return time.perf_counter() - start
    finally:
        await consumer.close()


CLIENTS: dict[str, tuple[Produce, Consume]] = {
    "rstream": (rstream_produce, rstream_consume),
}


# -- the measurement ---------------------------------------------------------------------------


def measure_rabbitmq_stream(
    count: int,
    size: int,
    *,
    batch: int = 1000,
    window: int = 20_000,
    client: str = "rstream",
    timeout: float = TIMEOUT,
) -> dict[str, float]:
    """Start a private RabbitMQ node on loopback with ``rabbitmq_stream`` on an ephemeral port,
    publish ``count`` messages of ``size`` bytes with confirms (``batch`` to a Publish frame,
    ``window`` unconfirmed), consume them all from ``first`` and stop the node. Returns msg/s
    and CPU µs per message, the broker's (``beam.smp``) and this client's, for each phase."""
    root = Path(tempfile.mkdtemp(prefix="tqbench-rmq-stream-"))
    try:
        with rabbitmq_stream_node(root) as node:
            produce, consume = _phases(node, count, size, batch, window, client, timeout)
            print(f"{node.version}, stream port {node.port}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "produce_rate": count / produce.seconds,
        "consume_rate": count / consume.seconds,
        "produce_cpu_us": produce.broker_cpu / count * 1e6,
        "consume_cpu_us": consume.broker_cpu / count * 1e6,
        "produce_client_cpu_us": produce.client_cpu / count * 1e6,
        "consume_client_cpu_us": consume.client_cpu / count * 1e6,
        "produce_seconds": produce.seconds,
        "consume_seconds": consume.seconds,
        # cores busy with anything but the broker and this client during the phase
        "produce_other_cores": _others(produce),
        "consume_other_cores": _others(consume),
    }


def _others(phase: Phase) -> float:
    return max(phase.machine_cpu - phase.broker_cpu - phase.client_cpu, 0.0) / phase.seconds


def _phases(
    node: StreamNode, count: int, size: int, batch: int, window: int, client: str, timeout: float
) -> tuple[Phase, Phase]:
    produce, consume = CLIENTS[client]
    payload = os.urandom(size)
    messages = [payload] * count  # one buffer: the client copies it into each frame anyway

    async def run() -> tuple[Phase, Phase]:
        async with asyncio.timeout(timeout):
            produced = await _sampled(node.pid, produce(node.port, messages, batch, window))
            consumed = await _sampled(node.pid, consume(node.port, count))
        return produced, consumed

    return asyncio.run(run())


async def _sampled(pid: int, phase: Awaitable[float]) -> Phase:
    """Run ``phase`` with the broker's and this process's CPU read before and after it (these
    include connecting: a few ms next to the seconds the messages take)."""
    broker_before, client_before = cpu_seconds(pid), time.process_time()
    machine_before = machine_cpu_seconds()
    seconds = await phase
    broker_after, client_after = cpu_seconds(pid), time.process_time()
    machine_after = machine_cpu_seconds()
    if broker_before is None or broker_after is None:
        raise RuntimeError(f"the broker process {pid} went away")
    return Phase(
        seconds,
        broker_after - broker_before,
        client_after - client_before,
        machine_after - machine_before,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000, help="messages per Publish frame")
    parser.add_argument("--window", type=int, default=20_000, help="unconfirmed messages")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="rstream")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds, whole run")
    parser.add_argument(
        "--wait-idle", type=float, default=0.0, help="wait this long for a quiet machine"
    )
    args = parser.parse_args()
    if args.wait_idle > 0:
        wait_for_idle(args.wait_idle, lambda line: print(line, file=sys.stderr))
    started = time.monotonic()
    result = measure_rabbitmq_stream(
        args.count,
        args.size,
        batch=args.batch,
        window=args.window,
        client=args.client,
        timeout=args.timeout,
    )
    for phase in ("produce", "consume"):
        seconds = result[f"{phase}_seconds"]
        client_share = result[f"{phase}_client_cpu_us"] * args.count / 1e6 / seconds
        broker_share = result[f"{phase}_cpu_us"] * args.count / 1e6 / seconds
        print(
            f"{phase}: {result[f'{phase}_rate']:,.0f} msg/s, broker {result[f'{phase}_cpu_us']:.2f}"
            f" CPU µs/msg ({broker_share:.0%} of a core), client {args.client}"
            f" {result[f'{phase}_client_cpu_us']:.2f} CPU µs/msg ({client_share:.0%} of a core),"
            f" other processes {result[f'{phase}_other_cores']:.2f} cores"
        )
    print(f"whole run, node start and stop included: {time.monotonic() - started:.1f} s")
    print(json.dumps({"client": args.client, "count": args.count, "size": args.size, **result}))


if __name__ == "__main__":
    main()
