"""What collecting metrics costs: publish (and consume) throughput of one tqbroker while
Prometheus scrapes it every second ("on") and while nothing does ("off"), runs interleaved, in
one run; optionally a second tqbroker from another source tree (``--baseline-src``: e.g. the
commit before the counters) interleaved too, for what counting itself costs.

    python benchmarks/metrics_cost.py [--runs 5] [--messages 200000] [--scrape-interval 1]
                                      [--workloads publish-transient,consume]
                                      [--baseline-src DIR] [--queues N]

"on" scrapes ``/metrics`` and ``/metrics/per-object`` on the metrics port in a thread for the
whole run (``--queues N`` declares N idle queues first, so each scrape has something to walk).
Prints each run, then one table of medians: off, on, on/off (and baseline, off/baseline), with
the scrapes' median duration. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from rawclient import RawClient
from targets import TqbrokerTarget
from workloads import WORKLOADS, Settings


class Scraper:
    """Scrapes the metrics endpoints every ``interval`` seconds in a thread."""

    def __init__(self, base_url: str, interval: float) -> None:
        self.base_url = base_url
        self.interval = interval
        self.durations: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:  # the first scrape at once, then every interval
            for path in ("/metrics", "/metrics/per-object"):
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(self.base_url + path, timeout=10) as response:
                        response.read()
                except OSError:
                    self.failures += 1
                    continue
                self.durations.append(time.perf_counter() - started)
            if self._stop.wait(self.interval):
                return

    @contextlib.contextmanager
    def running(self) -> Iterator[Scraper]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


@contextlib.contextmanager
def _python_path(src: str | None) -> Iterator[None]:
    """Start the broker process from another source tree (its ``src``) when given."""
    before = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = str(Path(src) / "src")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--workloads", default="publish-transient,consume")
    parser.add_argument("--baseline-src", help="a source tree to start a baseline broker from")
    parser.add_argument("--queues", type=int, default=0, help="idle queues declared first")
    args = parser.parse_args(argv)
    settings = Settings(runs=args.runs, messages=args.messages)
    workloads = [w for w in args.workloads.split(",") if w]
    results: dict[tuple[str, str], list[float]] = {}
    scrapes: list[float] = []
    cpu: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tqbroker-metrics-cost-") as tmp:
        target = TqbrokerTarget(Path(tmp) / "tqbroker", []).start()
        baseline = None
        if args.baseline_src:
            with _python_path(args.baseline_src):
                baseline = TqbrokerTarget(Path(tmp) / "baseline", []).start()
        try:
            assert target.process is not None
            assert target.process.metrics_port is not None
            url = f"http://127.0.0.1:{target.process.metrics_port}"
            if args.queues:
                with contextlib.closing(RawClient.connect(target.endpoint)) as client:
                    for i in range(args.queues):
                        client.declare(f"bench.idle.{i}", durable=False)
            for name in workloads:
                for run in range(args.runs):
                    modes = ["off", "on"] + (["baseline"] if baseline is not None else [])
                    if run % 2:
                        modes.reverse()
                    for mode in modes:
                        broker = baseline if mode == "baseline" else target
                        assert broker is not None
                        tag = f"{mode}{run}"
                        if mode == "on":
                            with Scraper(url, args.scrape_interval).running() as scraper:
                                measures = WORKLOADS[name](broker, settings, tag)
                            scrapes += scraper.durations
                        else:
                            measures = WORKLOADS[name](broker, settings, tag)
                        for key, measure in measures.items():
                            results.setdefault((key, mode), []).append(measure.value)
                            if measure.broker_cpu is not None:  # CPU µs per message
                                cpu_us = 1e6 * measure.broker_cpu / args.messages
                                cpu.setdefault((key, mode), []).append(cpu_us)
                            print(
                                f"{key} run {run + 1} {mode}: {measure.value:,.0f}",
                                file=sys.stderr,
                                flush=True,
                            )
        finally:
            target.close()
            if baseline is not None:
                baseline.close()
    keys = sorted({key for key, _mode in results})
    print(
        f"medians of {args.runs} runs, {args.messages} messages; 'on' = scraped every "
        f"{args.scrape_interval:g} s ({len(scrapes)} scrapes, median "
        f"{1000 * statistics.median(scrapes) if scrapes else float('nan'):.1f} ms)"
    )
    modes = ["off", "on"] + (["baseline"] if baseline is not None else [])
    for title, figures, unit in (
        ("throughput, msg/s (higher is better)", results, ",.0f"),
        ("broker CPU per message, µs (lower is better)", cpu, ".2f"),
    ):
        print(f"\n{title}")
        header = "| workload | " + " | ".join(modes) + " | on/off |"
        header += " off/baseline |" if baseline is not None else ""
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        for key in keys:
            medians = {
                m: statistics.median(figures[(key, m)]) for m in modes if (key, m) in figures
            }
            if len(medians) < len(modes):
                continue
            row = f"| {key} | " + " | ".join(format(medians[m], unit) for m in modes)
            row += f" | {medians['on'] / medians['off']:.3f} |"
            if baseline is not None:
                row += f" {medians['off'] / medians['baseline']:.3f} |"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
