"""Overload probes: one client's large job against a canary client's latency.

    python benchmarks/overload.py [--url amqp://...] [--jobs teardown,consumers,bulk,...]
                                  [--queues 100000] [--consumers 100000] [--records 500000]
                                  [--connections 10000] [--backlog 1000000]

Without ``--url`` a broker is started here (``python -m tqbroker`` on loopback, a temporary
data directory). While each job runs, a canary connection publishes a message and receives it
back, over and over (a round trip every few milliseconds); the report gives the canary's round
trips during the job: count, p50, p99 and the longest (the longest stall another client saw).

Jobs:
- ``teardown``: one connection declares ``--queues`` exclusive queues, then closes: the broker
  deletes them all;
- ``consumers``: one channel holds ``--consumers`` consumers on one queue, then the connection
  closes: the broker cancels them all;
- ``bulk``: one HTTP ``POST /topics/{t}/records`` of ``--records`` small records;
- ``durable``: one connection declares ``--queues`` durable queues (log backend) and publishes
  a persistent message to each, all confirmed: the broker's open descriptors stay within its
  file-handle cache's limit (a quarter of its descriptor limit);
- ``connections``: ``--connections`` clients connect (handshake, a channel), then all close;
- ``backlog``: ``--backlog`` transient 1 KiB messages published as fast as one connection can
  to a queue whose one consumer (prefetch 1) acks one message a second;
- ``flood``: as ``backlog`` against a broker whose memory watermark (when started here: 128MiB)
  the flood reaches: the publisher is blocked, the canary (it consumes, ``basic.get``, rather
  than publish: publishers are blocked too) must not be.

A probe, not a test: it asserts nothing. The issue's figures, before pacing: 4.9 s, 1.7 s, 6.0 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from array import array
from collections.abc import Callable
from pathlib import Path

from rawclient import CHANNEL, Endpoint, RawClient, publish_frames

from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.methods import BasicConsume, BasicGet, QueueDeclare
from tqbroker.recordbatch import BinaryColumn, WriteBatch, encode_write


class Canary(threading.Thread):
    """Round trips (publish, then receive it back) on a connection of its own."""

    def __init__(self, endpoint: Endpoint, *, consume_only: bool = False) -> None:
        super().__init__(daemon=True)
        self.consume_only = consume_only
        self.client = RawClient.connect(endpoint)
        self.client.declare("canary", durable=False)
        self.frames = publish_frames("canary", b"tweet")
        if consume_only:  # a stock of messages to get, one round trip each
            self.client.publish(self.frames, 100_000)
            self.client.declare("canary", durable=False)
        else:
            self.client.subscribe("canary", prefetch=10, tag="canary")
        self.samples: list[tuple[float, float]] = []  # (when it began, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
            if self.consume_only:
                self.client.call(BasicGet(queue="canary", no_ack=True))
                self.client.read_frame()  # the content header
                self.client.read_frame()  # the body
            else:
                self.client.publish(self.frames, 1)
                self.client.receive(1, ack_every=1)
            self.samples.append((began, time.perf_counter() - began))
            time.sleep(0.002)

    def during(self, start: float, end: float) -> list[float]:
        return [took for began, took in self.samples if start <= began <= end]


def teardown(endpoint: Endpoint, count: int) -> tuple[float, float]:
    client = RawClient.connect(endpoint)
    for n in range(count):
        client.send(CHANNEL, QueueDeclare(queue=f"x{n}", exclusive=True, nowait=True))
    client.declare("x-sync", durable=False)  # all the declares before it are done
    start = time.perf_counter()
    client.close()
    return start, time.perf_counter()


def consumers(endpoint: Endpoint, count: int) -> tuple[float, float]:
    client = RawClient.connect(endpoint)
    client.declare("many-consumers", durable=False)
    client.qos(1)
    for n in range(count):
        client.send(
            CHANNEL, BasicConsume(queue="many-consumers", consumer_tag=f"c{n}", nowait=True)
        )
    client.declare("many-consumers", durable=False)
    start = time.perf_counter()
    client.close()
    return start, time.perf_counter()


def durable(endpoint: Endpoint, count: int) -> tuple[float, float]:
    client = RawClient.connect(endpoint)
    start = time.perf_counter()
    on_log: FieldTable = {"x-queue-backend": "log"}
    for n in range(count):
        client.send(
            CHANNEL, QueueDeclare(queue=f"d{n}", durable=True, arguments=on_log, nowait=True)
        )
        if n % 1000 == 999:
            client.declare(f"d{n}", on_log)  # a thousand declares in flight at most
    client.declare("d-sync", on_log)
    client.confirm_select()
    for n in range(count):
        client.publish(publish_frames(f"d{n}", b"m%d" % n, persistent=True), 1)
    client.publish_confirmed_frames(publish_frames("d-sync", b"", persistent=True), 1)
    end = time.perf_counter()
    client.close()
    return start, end


def connections(endpoint: Endpoint, count: int) -> tuple[float, float]:
    start = time.perf_counter()
    clients = [RawClient.connect(endpoint) for _ in range(count)]
    for client in clients:
        client.close()
    return start, time.perf_counter()


def backlog(endpoint: Endpoint, count: int, queue: str = "backlog") -> tuple[float, float]:
    slow = RawClient.connect(endpoint)
    slow.declare(queue, durable=False)
    slow.subscribe(queue, prefetch=1, tag="slow")
    stop = threading.Event()

    def consume_slowly() -> None:
        while not stop.is_set():
            slow.receive(1, ack_every=1)
            stop.wait(1.0)

    threading.Thread(target=consume_slowly, daemon=True).start()
    publisher = RawClient.connect(endpoint)
    start = time.perf_counter()
    publisher.publish(publish_frames(queue, b"b" * 1024), count, batch=256)
    publisher.declare(queue, durable=False)  # answered once every publish before it is queued
    end = time.perf_counter()
    stop.set()
    publisher.close()
    return start, end


def bulk(http: str, count: int) -> tuple[float, float]:
    auth = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}  # guest:guest
    create = urllib.request.Request(
        f"{http}/topics/bulk", b'{"partitions": 1}', {**auth, "Content-Type": "application/json"}
    )
    create.method = "PUT"
    urllib.request.urlopen(create).read()
    batch = WriteBatch(
        array("i", [-1]) * count,
        BinaryColumn.of([b"k%d" % n for n in range(count)]),
        BinaryColumn.of([b"v" * 64] * count),
        BinaryColumn.of([b""] * count),
    )
    body = encode_write(batch)
    post = urllib.request.Request(
        f"{http}/topics/bulk/records",
        body,
        {**auth, "Content-Type": "application/x-tqbroker-records"},
    )
    start = time.perf_counter()
    urllib.request.urlopen(post, timeout=600).read()
    return start, time.perf_counter()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running broker (default: start one here)")
    parser.add_argument("--http", help="its HTTP API (default: the one started here)")
    parser.add_argument("--jobs", default="teardown,consumers,bulk")
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--consumers", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tqbroker-overload-") as tmp:
        broker = None
        url, http = args.url, args.http
        if url is None:
            broker, url, http = _start(Path(tmp), "flood" in args.jobs.split(","))
        try:
            endpoint = Endpoint.from_url(url)
            jobs: dict[str, Callable[[], tuple[float, float]]] = {
                "teardown": lambda: teardown(endpoint, args.queues),
                "consumers": lambda: consumers(endpoint, args.consumers),
                "bulk": lambda: bulk(http, args.records),
                "connections": lambda: connections(endpoint, args.connections),
                "durable": lambda: durable(endpoint, args.queues),
                "backlog": lambda: backlog(endpoint, args.backlog),
                "flood": lambda: backlog(endpoint, args.backlog, "flood"),
            }
            print(
                "| job | size | job time | canary round trips | p50 | p99 | longest "
                "| broker RSS before / after | broker descriptors after |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for name in args.jobs.split(","):
                canary = Canary(endpoint, consume_only=name == "flood")
                canary.start()
                time.sleep(0.5)
                rss_before = _rss(broker)
                start, end = jobs[name]()
                time.sleep(0.5)  # what the broker still does after the client is done
                canary.stop.set()
                canary.join()
                took = canary.during(start, end + 0.5)
                size = {
                    "teardown": args.queues,
                    "durable": args.queues,
                    "consumers": args.consumers,
                    "connections": args.connections,
                    "bulk": args.records,
                }.get(name, args.backlog)
                print(
                    f"| {name} | {size} | {end - start:.2f} s | {len(took)} | "
                    f"{_ms(statistics.median(took))} | {_ms(_p99(took))} | {_ms(max(took))} | "
                    f"{rss_before} / {_rss(broker)} | {_descriptors(broker)} |"
                )
                canary.client.close()
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(30)
    return 0


def _start(directory: Path, flood: bool) -> tuple[subprocess.Popen[str], str, str]:
    watermark = ["--memory-high-watermark", "128MiB"] if flood else []
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "0"),
            *("--metrics-port", "-1"),
            *("--data-dir", str(directory / "data"), "--log-level", "WARNING", *watermark),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # tqbroker X ready: listening on amqp://H:P, http://H:P
    amqp, http = (part.strip() for part in line.split("listening on ")[1].split(","))
    return proc, amqp.replace("amqp://", "amqp://guest:guest@") + "/", http


def _rss(broker: subprocess.Popen[str] | None) -> str:
    """The resident memory of the broker started here ("-" for one at ``--url``)."""
    if broker is None:
        return "-"
    with open(f"/proc/{broker.pid}/statm") as statm:
        return f"{int(statm.read().split()[1]) * 4096 / 2**20:.0f} MiB"


def _descriptors(broker: subprocess.Popen[str] | None) -> str:
    return "-" if broker is None else str(len(os.listdir(f"/proc/{broker.pid}/fd")))


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
