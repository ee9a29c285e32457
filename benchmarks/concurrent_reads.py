"""Concurrent big HTTP reads against a memory high watermark (issue 33 row 5, bounded reads):
the broker's peak RSS and the worst gap between an AMQP publisher's confirms while they run.

    python benchmarks/concurrent_reads.py [--reads 32] [--max-bytes 64MiB] [--watermark 512MiB]
                                          [--format frames|columns|json] [--fill 80MiB]

Starts ``python -m tqbroker`` (log backend, ``--memory-high-watermark``), fills a one-partition
topic with ``--fill`` bytes of 64 KiB records through the bulk write (4 MiB a request), starts a
pika publisher (publisher confirms, one message at a time, on a connection of its own) and a
sampler of the broker's resident set (every 20 ms, from ``/proc``), then issues ``--reads``
concurrent reads of ``--max-bytes`` each (a thread and an HTTP connection each, the response
streamed and counted, not kept) and prints one line: the reads' bytes and time, the broker's RSS
before and at its peak, whether it passed the watermark, and the publisher's confirms and worst
confirm gap. A probe, not a test: it asserts nothing (``tests/http/test_read_budget.py`` does).
Before/after figures: ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from array import array
from pathlib import Path

import httpx
import pika

from tqbroker.recordbatch import BinaryColumn, WriteBatch, encode_write
from tqbroker.resources import parse_limit
from tqbroker.testing import BrokerProcess, start_broker_process

MIB = 1024 * 1024
TOPIC = "reads"
RECORD = 64 * 1024
PATHS = {
    "frames": (f"/topics/{TOPIC}/partitions/0/records", {"format": "frames"}),
    "columns": (f"/topics/{TOPIC}/partitions/0/records", {}),
    "json": (f"/topics/{TOPIC}/messages", {"limit": "10000"}),
}


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def fill(http: httpx.Client, total: int) -> None:
    """``total`` bytes of ``RECORD``-byte text records, 4 MiB a request."""
    http.put(f"/topics/{TOPIC}", json={"partitions": 1}).raise_for_status()
    per_request = 4 * MIB // RECORD
    written = 0
    while written < total:
        n = min(per_request, (total - written + RECORD - 1) // RECORD)
        body = encode_write(
            WriteBatch(
                array("i", [0] * n),
                BinaryColumn.of([b"k%d" % i for i in range(n)]),
                BinaryColumn.of(
                    [(b"%08d" % (written // RECORD + i)) * (RECORD // 8) for i in range(n)]
                ),
                BinaryColumn.of([b""] * n),
            )
        )
        http.post(f"/topics/{TOPIC}/records", content=body, timeout=120).raise_for_status()
        written += n * RECORD


class Publisher:
    """Publishes one message at a time with confirms on its own connection: the gaps between
    confirms (a blocked connection shows as one long gap)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.confirms = 0
        self.worst_gap = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            params = pika.URLParameters(self.url + "?blocked_connection_timeout=600")
            connection = pika.BlockingConnection(params)
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("probe-publisher", arguments={"x-max-length": 1000})
            last = time.perf_counter()
            while not self._stop.is_set():
                channel.basic_publish("", "probe-publisher", b"p" * 100)
                now = time.perf_counter()
                if self.confirms:  # the first one waits for the connection
                    self.worst_gap = max(self.worst_gap, now - last)
                last = now
                self.confirms += 1
                self._ready.set()
                connection.sleep(0.002)
            connection.close()
        except Exception as exc:
            self.errors.append(repr(exc))
            self._ready.set()

    def __enter__(self) -> Publisher:
        self._thread.start()
        self._ready.wait(30)
        self.worst_gap = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


class Sampler:
    """The broker's peak resident set, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def read(base: str, kind: str, max_bytes: int, results: list[tuple[int, int]]) -> None:
    path, query = PATHS[kind]
    with (
        httpx.Client(base_url=base, auth=("guest", "guest"), timeout=600) as http,
        http.stream("GET", path, params={**query, "max_bytes": str(max_bytes)}) as response,
    ):
        size = sum(len(chunk) for chunk in response.iter_raw())
        results.append((response.status_code, size))


def probe(broker: BrokerProcess, args: argparse.Namespace) -> str:
    base = broker.http_url
    with httpx.Client(base_url=base, auth=("guest", "guest"), timeout=120) as http:
        fill(http, args.fill)
    before = rss_bytes(broker.proc.pid)
    results: list[tuple[int, int]] = []
    with Publisher(broker.url) as publisher, Sampler(broker.proc.pid) as sampler:
        started = time.perf_counter()
        threads = [
            threading.Thread(target=read, args=(base, args.format, args.max_bytes, results))
            for _ in range(args.reads)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.perf_counter() - started
        time.sleep(0.5)  # the publisher's confirms after the reads
    statuses = sorted({status for status, _size in results})
    read_bytes = sum(size for _status, size in results)
    return (
        f"{args.reads} x {args.format} reads of {args.max_bytes / MIB:.0f} MiB: "
        f"statuses {statuses}, {read_bytes / MIB:,.0f} MiB in {took:.1f} s; broker RSS "
        f"{before / MIB:,.0f} -> peak {sampler.peak / MIB:,.0f} MiB "
        f"(watermark {args.watermark_bytes / MIB:,.0f} MiB: "
        f"{'over' if sampler.peak > args.watermark_bytes else 'under'}); publisher "
        f"{publisher.confirms} confirms, worst confirm gap {publisher.worst_gap * 1000:,.0f} ms"
        + (f", errors {publisher.errors}" if publisher.errors else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=32)
    parser.add_argument("--max-bytes", default="64MiB")
    parser.add_argument("--watermark", default="512MiB")
    parser.add_argument("--format", choices=sorted(PATHS), default="frames")
    parser.add_argument("--fill", default="80MiB")
    args = parser.parse_args()
    args.max_bytes = int(parse_limit(args.max_bytes, "--max-bytes").bytes(0))
    args.fill = int(parse_limit(args.fill, "--fill").bytes(0))
    args.watermark_bytes = parse_limit(args.watermark, "--watermark").bytes(0)
    with (
        tempfile.TemporaryDirectory() as data,
        start_broker_process(
            Path(data),
            durable_backend="log",
            extra_args=["--memory-high-watermark", args.watermark],
        ) as broker,
    ):
        print(probe(broker, args), flush=True)


if __name__ == "__main__":
    main()
