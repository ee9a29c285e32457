"""A crowd of consumers on one queue: deliveries/s with 1, 10k and 100k consumers, and what
another client sees meanwhile.

    python benchmarks/consumer_crowd.py [--url amqp://...] [--crowds 1,10000,100000]
                                        [--channels 100] [--prefetch 1000] [--messages 200000]
                                        [--seconds 10] [--json PATH]

Without ``--url`` a broker is started here (``python -m tqbroker`` on loopback, a temporary data
directory; it imports tqbroker from ``PYTHONPATH``, so pointing that at another tree measures
that tree). For each crowd size N:

- a crowd process opens one connection, ``--channels`` channels (at most N), a per-consumer
  prefetch of ``--prefetch`` on each, and N consumers on the queue ``crowd`` spread evenly over
  them (``basic.consume`` nowait, then one synchronous call: all registered);
- this process publishes ``--messages`` transient messages to the queue (one connection, no
  confirms); the crowd receives them, acking each channel's deliveries (``multiple``) every
  ``ACK_EVERY``; deliveries/s is what it received over the time from the first publish to its
  last delivery, at most ``--seconds`` (a slow broker is measured on what it delivered by then);
- then the crowd closes its connection and this process waits until the queue has no consumer
  left (the broker cancelled all N and requeued what they held);
- all along, a canary process (a connection of its own) publishes a message to its own queue
  and receives it back, over and over: the longest of its round trips during the deliveries and
  during the close is the longest stall another client saw.

The report: per crowd size, deliveries/s, the canary's longest round trip during the deliveries
and during the close, the close's duration; then the ratio of the last crowd's rate to the
first's (``--json``: the same as a JSON document). A probe: it asserts nothing
(``tests/benchmarks/test_consumer_crowd.py`` runs it and checks the ratio).

The issue's figures: 1 consumer 100k deliveries/s, 10k 4.5k/s, 100k 410/s with another client
stalled 2.3 s; a close of a connection with 100k consumers stalled other clients 1.74 s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import multiprocessing.connection
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rawclient import _BASIC_DELIVER, _FATAL, _U32, _U64, Endpoint, RawClient, publish_frames

from tqbroker.protocol.frames import FRAME_HEAD, FRAME_METHOD, encode_method
from tqbroker.protocol.methods import (
    BasicAck,
    BasicConsume,
    BasicQos,
    BasicQosOk,
    ChannelOpen,
    ChannelOpenOk,
    QueueDeclare,
    QueueDeclareOk,
    QueuePurge,
)

QUEUE = "crowd"
CANARY_QUEUE = "crowd-canary"
ACK_EVERY = 100  # deliveries per channel between two ``multiple`` acks
CONSUMES_PER_SEND = 1000  # nowait basic.consume frames per sendall
CLOSE_TIMEOUT = 120.0  # seconds the broker may take to cancel a crowd


# -- the crowd -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrowdPlan:
    endpoint: Endpoint
    consumers: int
    channels: int
    prefetch: int
    messages: int
    seconds: float


def crowd(plan: CrowdPlan, pipe: multiprocessing.connection.Connection) -> None:
    """The crowd process: register, say ``ready``, receive until told the publish start time
    (then until ``messages`` or the deadline), report, then close when told and report when
    the close-ok came."""
    client = RawClient.connect(plan.endpoint, timeout=CLOSE_TIMEOUT)
    channels = max(1, min(plan.channels, plan.consumers))
    numbers = list(range(1, channels + 1))
    for number in numbers[1:]:  # channel 1 is open already
        client.send(number, ChannelOpen())
        assert isinstance(client.read_method(), ChannelOpenOk)
    for number in numbers:
        client.send(number, BasicQos(prefetch_count=plan.prefetch))
        assert isinstance(client.read_method(), BasicQosOk)
    pending = bytearray()
    for n in range(plan.consumers):
        number = numbers[n % channels]
        consume = BasicConsume(queue=QUEUE, consumer_tag=f"c{n}", nowait=True)
        pending += encode_method(number, consume)
        if n % CONSUMES_PER_SEND == CONSUMES_PER_SEND - 1:
            client.sock.sendall(pending)
            pending.clear()
    client.sock.sendall(pending)
    client.send(1, QueueDeclare(queue=QUEUE, passive=True))  # answered after every consume
    declared = client.read_method()
    assert isinstance(declared, QueueDeclareOk), declared
    assert declared.consumer_count == plan.consumers, declared
    pipe.send("ready")
    started: float = pipe.recv()
    received, last = _receive(client, plan.messages, started + plan.seconds)
    pipe.send((received, last))
    pipe.recv()  # "close"
    closing = time.perf_counter()
    client.close(timeout=CLOSE_TIMEOUT)
    pipe.send((closing, time.perf_counter()))


def _receive(client: RawClient, count: int, deadline: float) -> tuple[int, float]:
    """Deliveries on any channel until ``count`` or ``deadline``, each channel acked
    (``multiple``) every ``ACK_EVERY`` of its deliveries; how many, and when the last came."""
    sock, buf, head, u32, u64 = client.sock, client.buf, FRAME_HEAD, _U32, _U64
    unacked: dict[int, int] = {}
    received = 0
    last = time.perf_counter()
    acks = bytearray()
    while received < count:
        now = time.perf_counter()
        if now >= deadline:
            break
        sock.settimeout(max(deadline - now, 0.001))
        try:
            chunk = sock.recv(1 << 18)
        except TimeoutError:
            break
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        last = time.perf_counter()
        buf += chunk
        pos, end = 0, len(buf)
        while pos + 7 <= end:
            frame_type, channel, length = head.unpack_from(buf, pos)
            if pos + 8 + length > end:
                break
            if frame_type == FRAME_METHOD:
                ids = u32.unpack_from(buf, pos + 7)[0]
                if ids == _BASIC_DELIVER:
                    received += 1
                    pending = unacked.get(channel, 0) + 1
                    if pending >= ACK_EVERY:
                        tag_at = pos + 12 + buf[pos + 11]  # after the consumer tag
                        tag = u64.unpack_from(buf, tag_at)[0]
                        acks += encode_method(channel, BasicAck(tag, True))
                        pending = 0
                    unacked[channel] = pending
                elif ids in _FATAL:
                    client._refused(pos)
            pos += 8 + length
        del buf[:pos]
        if acks:
            sock.sendall(acks)
            acks.clear()
    sock.settimeout(CLOSE_TIMEOUT)
    return received, last


# -- the canary ------------------------------------------------------------------------------


@contextmanager
def canary_process(endpoint: Endpoint) -> Iterator[multiprocessing.connection.Connection]:
    """``canary`` in a process of its own, started and ready: this side's end of its pipe
    (send ``mark``, ``report``; ``stop`` is sent on leaving)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    watcher = context.Process(target=canary, args=(endpoint, theirs), daemon=True)
    watcher.start()
    try:
        if not ours.poll(30) or ours.recv() != "ready":
            raise RuntimeError("the canary did not start")
        yield ours
        ours.send("stop")
    finally:
        watcher.join(10)
        if watcher.is_alive():
            watcher.kill()


def canary(endpoint: Endpoint, pipe: multiprocessing.connection.Connection) -> None:
    """Round trips on a connection of its own (publish one message to its queue, receive it
    back, ack), a couple of milliseconds apart. Commands: ``mark`` starts a window, ``report``
    answers the window's round trips and the longest, ``stop``."""
    client = RawClient.connect(endpoint)
    client.declare(CANARY_QUEUE, durable=False)
    client.subscribe(CANARY_QUEUE, prefetch=10, tag="canary")
    frames = publish_frames(CANARY_QUEUE, b"tweet")
    trips, longest = 0, 0.0
    pipe.send("ready")
    while True:
        while pipe.poll():
            command = pipe.recv()
            if command == "mark":
                trips, longest = 0, 0.0
            elif command == "report":
                pipe.send((trips, longest))
            else:
                client.close()
                return
        began = time.perf_counter()
        client.publish(frames, 1)
        client.receive(1, ack_every=1)
        trips += 1
        longest = max(longest, time.perf_counter() - began)
        time.sleep(0.002)


# -- one crowd size --------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    consumers: int
    delivered: int
    rate: float  # deliveries/s
    stall_delivering: float  # the canary's longest round trip meanwhile (s)
    close_seconds: float  # from connection.close until the queue had no consumer
    stall_closing: float


def measure(plan: CrowdPlan, canary_pipe: multiprocessing.connection.Connection) -> Figures:
    setup = RawClient.connect(plan.endpoint, timeout=CLOSE_TIMEOUT)
    setup.declare(QUEUE, durable=False)
    setup.call(QueuePurge(queue=QUEUE))
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=crowd, args=(plan, theirs), daemon=True)
    process.start()
    try:
        if not ours.poll(600) or ours.recv() != "ready":
            raise RuntimeError("the crowd did not register its consumers")
        publisher = RawClient.connect(plan.endpoint, timeout=CLOSE_TIMEOUT)
        frames = publish_frames(QUEUE, b"m" * 64)
        canary_pipe.send("mark")
        started = time.perf_counter()
        ours.send(started)
        thread = threading.Thread(target=_publish, args=(publisher, frames, plan.messages))
        thread.start()
        received, last = ours.recv()
        canary_pipe.send("report")
        _, stall_delivering = canary_pipe.recv()
        publisher.sock.shutdown(socket.SHUT_RDWR)  # a slow broker may still be reading it
        thread.join()
        publisher.sock.close()
        setup.call(QueuePurge(queue=QUEUE))  # the close requeues only what the crowd held
        canary_pipe.send("mark")
        ours.send("close")
        closing, _close_ok = ours.recv()
        deadline = time.perf_counter() + CLOSE_TIMEOUT
        while _consumer_count(setup) and time.perf_counter() < deadline:
            time.sleep(0.005)
        closed = time.perf_counter()
        time.sleep(0.2)  # what the broker still does once the consumers are gone
        canary_pipe.send("report")
        _, stall_closing = canary_pipe.recv()
        setup.delete_queue(QUEUE)
        setup.close()
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    return Figures(
        plan.consumers,
        received,
        received / max(last - started, 1e-9),
        stall_delivering,
        closed - closing,
        stall_closing,
    )


def _publish(publisher: RawClient, frames: bytes, count: int) -> None:
    with contextlib.suppress(OSError):  # shut down by ``measure``: the measurement is over
        publisher.publish(frames, count, batch=256)


def _consumer_count(client: RawClient) -> int:
    declared = client.call(QueueDeclare(queue=QUEUE, passive=True))
    assert isinstance(declared, QueueDeclareOk), declared
    return declared.consumer_count


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running broker (default: start one here)")
    parser.add_argument("--crowds", default="1,10000,100000", help="consumer counts")
    parser.add_argument("--channels", type=int, default=100, help="channels of the crowd")
    parser.add_argument("--prefetch", type=int, default=1000, help="per consumer")
    parser.add_argument("--messages", type=int, default=200_000, help="published per crowd")
    parser.add_argument("--seconds", type=float, default=10.0, help="longest delivery phase")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    crowds = [int(n) for n in args.crowds.split(",")]
    with tempfile.TemporaryDirectory(prefix="tqbroker-crowd-") as tmp:
        broker = None
        url = args.url
        if url is None:
            broker, url = _start(Path(tmp))
        endpoint = Endpoint.from_url(url)
        try:
            with canary_process(endpoint) as ours:
                _measure_crowds(args, crowds, endpoint, ours)
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(60)
    return 0


def _measure_crowds(
    args: argparse.Namespace,
    crowds: list[int],
    endpoint: Endpoint,
    ours: multiprocessing.connection.Connection,
) -> None:
    """The table (and ``--json``): each crowd's figures, then the ratio of the last to the
    first."""
    print(
        f"| consumers | channels | delivered | deliveries/s | canary longest (delivering) "
        f"| close | canary longest (closing) |   prefetch {args.prefetch}"
    )
    print("|---|---|---|---|---|---|---|")
    rows: list[Figures] = []
    for consumers in crowds:
        plan = CrowdPlan(
            endpoint, consumers, args.channels, args.prefetch, args.messages, args.seconds
        )
        figures = measure(plan, ours)
        rows.append(figures)
        print(
            f"| {consumers} | {max(1, min(args.channels, consumers))} "
            f"| {figures.delivered} | {figures.rate:,.0f} "
            f"| {_ms(figures.stall_delivering)} | {figures.close_seconds:.2f} s "
            f"| {_ms(figures.stall_closing)} |",
            flush=True,
        )
    ratio = rows[-1].rate / rows[0].rate if rows[0].rate else 0.0
    if len(rows) > 1:
        print(f"ratio {rows[-1].consumers} consumers / {rows[0].consumers}: {ratio:.2f}")
    if args.json is not None:
        document = {"crowds": [dataclasses.asdict(row) for row in rows], "ratio": ratio}
        args.json.write_text(json.dumps(document, indent=2))


def _start(directory: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "0"),
            *("--metrics-port", "-1"),
            *("--data-dir", str(directory / "data"), "--log-level", "WARNING"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # tqbroker X ready: listening on amqp://H:P, http://H:P
    amqp = line.split("listening on ")[1].split(",")[0].strip()
    return proc, amqp.replace("amqp://", "amqp://guest:guest@") + "/"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
