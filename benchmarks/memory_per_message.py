"""Memory per queued transient message, tqbroker beside RabbitMQ.

    python benchmarks/memory_per_message.py [--queued 200000] [--body-size 1024]
        [--runs 3] [--page-window N] [--rabbitmq start|none]

Each run: a fresh broker, a transient queue, N transient messages published with confirms
(window 256) and no consumer; RSS of the broker process before and after (after: once it stops
falling, as the suite's memory rows); (RSS after - RSS before) / N. Runs alternate the brokers
(A/B/A/B) and the medians are printed. ``--page-window`` sets tqbroker's memory backend window
(ready messages kept in memory per queue before paging out; default 100k): a window >= N measures
the in-memory cost alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from targets import Epmd, RabbitMQTarget, Target, TqbrokerTarget, rabbit_script
from workloads import Settings, memory_transient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queued", type=int, default=200_000)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--page-window", type=int, help="tqbroker's page_window (100k)")
    parser.add_argument("--rabbitmq", choices=("start", "none"), default="start")
    parser.add_argument("--settle-window", type=float, default=10.0)
    args = parser.parse_args(argv)
    settings = Settings(
        queued=args.queued, body_size=args.body_size, settle_window=args.settle_window
    )
    epmd = Epmd()
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tqbroker-memory-") as tmp:
        root = Path(tmp)
        extra: list[str] = []
        if args.page_window is not None:
            config = root / "broker.toml"
            config.write_text(f"[backend_options.memory]\npage_window = {args.page_window}\n")
            extra = ["--config", str(config), "--memory-high-watermark", "0.9"]
        targets: list[Target] = []
        try:
            targets.append(TqbrokerTarget(root / "tqbroker", extra).start())
            server, ctl = rabbit_script("rabbitmq-server"), rabbit_script("rabbitmqctl")
            if args.rabbitmq == "start" and server and ctl:
                targets.append(RabbitMQTarget(root / "rabbitmq", server, ctl, epmd=epmd).start())
            for run in range(args.runs):
                for target in targets:
                    measure = memory_transient(target, settings, f"run{run}")["memory_transient"]
                    figures.setdefault(target.name, []).append(measure.value)
                    fill = float(measure.detail["rss_right_after_fill"])
                    grown = (fill - float(measure.detail["rss_before"])) / args.queued
                    print(
                        f"run {run + 1} {target.name}: {measure.value:,.0f} B/msg "
                        f"({grown:,.0f} right after the fill)",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for target in targets:
                target.close()
            epmd.cleanup()
    body = args.body_size
    print(f"memory per queued transient message ({args.queued:,} x {body} B, medians):")
    for name, values in figures.items():
        print(f"  {name:<10} {statistics.median(values):8,.0f} B   runs: {values}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
