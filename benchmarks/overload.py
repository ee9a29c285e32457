"""Overload probes: one client's large job against a canary client's latency.

    python benchmarks/overload.py [--url amqp://...] [--jobs teardown,consumers,bulk]
                                  [--queues 100000] [--consumers 100000] [--records 500000]

Without ``--url`` a broker is started here (``python -m tqbroker`` on loopback, a temporary
data directory). While each job runs, a canary connection publishes a message and receives it
back, over and over (a round trip every few milliseconds); the report gives the canary's round
trips during the job: count, p50, p99 and the longest (the longest stall another client saw).

Jobs:
- ``teardown``: one connection declares ``--queues`` exclusive queues, then closes: the broker
  deletes them all;
- ``consumers``: one channel holds ``--consumers`` consumers on one queue, then the connection
  closes: the broker cancels them all;
- ``bulk``: one HTTP ``POST /topics/{t}/records`` of ``--records`` small records.

A probe, not a test: it asserts nothing. The issue's figures, before pacing: 4.9 s, 1.7 s, 6.0 s.
"""

from __future__ import annotations

import argparse
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

from tqbroker.protocol.methods import BasicConsume, QueueDeclare
from tqbroker.recordbatch import BinaryColumn, WriteBatch, encode_write


class Canary(threading.Thread):
    """Round trips (publish, then receive it back) on a connection of its own."""

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(daemon=True)
        self.client = RawClient.connect(endpoint)
        self.client.declare("canary", durable=False)
        self.client.subscribe("canary", prefetch=10, tag="canary")
        self.frames = publish_frames("canary", b"tweet")
        self.samples: list[tuple[float, float]] = []  # (when it began, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tqbroker-overload-") as tmp:
        broker = None
        url, http = args.url, args.http
        if url is None:
            broker, url, http = _start(Path(tmp))
        try:
            endpoint = Endpoint.from_url(url)
            jobs: dict[str, Callable[[], tuple[float, float]]] = {
                "teardown": lambda: teardown(endpoint, args.queues),
                "consumers": lambda: consumers(endpoint, args.consumers),
                "bulk": lambda: bulk(http, args.records),
            }
            print("| job | size | job time | canary round trips | p50 | p99 | longest |")
            print("|---|---|---|---|---|---|---|")
            for name in args.jobs.split(","):
                canary = Canary(endpoint)
                canary.start()
                time.sleep(0.5)
                start, end = jobs[name]()
                time.sleep(0.5)  # what the broker still does after the client is done
                canary.stop.set()
                canary.join()
                took = canary.during(start, end + 0.5)
                size = {"teardown": args.queues, "consumers": args.consumers}.get(
                    name, args.records
                )
                print(
                    f"| {name} | {size} | {end - start:.2f} s | {len(took)} | "
                    f"{_ms(statistics.median(took))} | {_ms(_p99(took))} | {_ms(max(took))} |"
                )
                canary.client.close()
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(30)
    return 0


def _start(directory: Path) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "0"),
            *("--data-dir", str(directory / "data"), "--log-level", "WARNING"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # tqbroker X ready: listening on amqp://H:P, http://H:P
    amqp, http = (part.strip() for part in line.split("listening on ")[1].split(","))
    return proc, amqp.replace("amqp://", "amqp://guest:guest@") + "/", http


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
