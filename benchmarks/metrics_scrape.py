"""How long a Prometheus scrape takes with many queues, and how long it holds up the broker's
other clients: one tqbroker, ``--queues`` queues declared (each with a message), then
``/metrics`` and ``/metrics/per-object`` scraped ``--scrapes`` times each while a client
measures AMQP round trips (``queue.declare`` passive) throughout.

    python benchmarks/metrics_scrape.py [--queues 10000] [--scrapes 10]

Prints, per endpoint: the scrape's median and max wall time (as the scraper sees it), the
exposition's size, the broker's CPU per scrape (``--queues 1 --scrapes 500``: what scraping an
idle broker every second costs it), and the worst AMQP round trip while scrapes ran against
the worst while none did. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from procstats import cpu_seconds
from rawclient import RawClient, publish_frames
from targets import TqbrokerTarget


def _round_trips(client: RawClient, stop: threading.Event, found: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        client.message_count("bench.scrape.0")
        found.append(time.perf_counter() - started)
        time.sleep(0.001)


def _measure_round_trips(client: RawClient, work: Callable[[], None]) -> tuple[float, float]:
    """(median, worst) AMQP round trip while ``work()`` runs."""
    stop, found = threading.Event(), list[float]()
    thread = threading.Thread(target=_round_trips, args=(client, stop, found))
    thread.start()
    try:
        work()
    finally:
        stop.set()
        thread.join()
    return statistics.median(found), max(found)


def _scrape(url: str, count: int, times: list[float], sizes: list[int]) -> None:
    for _ in range(count):
        begun = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as response:
            sizes.append(len(response.read()))
        times.append(time.perf_counter() - begun)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tqbroker-metrics-scrape-") as tmp:
        target = TqbrokerTarget(Path(tmp) / "tqbroker", []).start()
        try:
            assert target.process is not None
            assert target.process.metrics_port is not None
            url = f"http://127.0.0.1:{target.process.metrics_port}"
            client = RawClient.connect(target.endpoint)
            started = time.perf_counter()
            for i in range(args.queues):
                client.declare(f"bench.scrape.{i}", durable=False)
                client.publish(publish_frames(f"bench.scrape.{i}", b"x"), 1)
            client.wait_for_count(f"bench.scrape.{args.queues - 1}", 1)
            print(
                f"{args.queues} queues declared in {time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
            idle = _measure_round_trips(client, lambda: time.sleep(2))
            print(
                f"AMQP round trip, no scrape: median {1000 * idle[0]:.2f} ms, "
                f"worst {1000 * idle[1]:.1f} ms"
            )
            for path in ("/metrics", "/metrics/per-object"):
                times: list[float] = []
                sizes: list[int] = []
                scrape = functools.partial(_scrape, url + path, args.scrapes, times, sizes)
                cpu_before = cpu_seconds(target.pid) or 0.0
                busy = _measure_round_trips(client, scrape)
                cpu_per_scrape = ((cpu_seconds(target.pid) or 0.0) - cpu_before) / args.scrapes
                print(
                    f"{path}: {args.scrapes} scrapes, median {1000 * statistics.median(times):.1f}"
                    f" ms, max {1000 * max(times):.1f} ms, {sizes[-1]:,} bytes, broker CPU per "
                    f"scrape "
                    f"{1000 * cpu_per_scrape:.1f} ms (with the round trips); AMQP round trip "
                    f"meanwhile: median {1000 * busy[0]:.2f} ms, worst {1000 * busy[1]:.1f} ms"
                )
            client.close()
        finally:
            target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
