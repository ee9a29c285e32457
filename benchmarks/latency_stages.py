"""Where end-to-end latency goes inside tqbroker: the suite's ``latency`` workload (a publisher
at a fixed rate stamping each body, a consumer subscribed before) against a tqbroker started
with ``TQBROKER_LATENCY_TRACE`` (``src/tqbroker/server/latency_trace.py``), and the p50 / p99 /
p99.9 / max of each stage a message passes:

  client send -> read: loopback, and the broker's reader task woken (epoll, Trio's scheduler)
  read -> parsed: the frames of that read before it (and its own) parsed
  parsed -> routed: checks, exchange routing, enqueued, the queue actor woken
  routed -> encoded: the queue actor scheduled, the delivery encoded into the writer's buffer
  encoded -> send start: the writer task scheduled
  send start -> client read: the ``send`` system call, loopback, the consumer process woken

and, beside the chain, ``send_all`` (the system call, then a Trio checkpoint: the consumer often
has the bytes before it returns).

Then, for the messages slower than the end-to-end p99, which stage was their largest, and how
many overlapped a garbage collector pause. Run::

  python benchmarks/latency_stages.py --runs 3 --seconds 10
  python benchmarks/latency_stages.py --tqbroker-arg=--fsync=never --json stages.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

from loadgen import Consume, Job, PacedPublish, run_jobs
from rawclient import RawClient
from targets import TqbrokerTarget

from tqbroker.server.latency_trace import ENV

# Stage names as printed, and the trace's stage (or "client") each one ends at.
STAGES = (
    ("client send -> read", "read"),
    ("read -> parsed", "parsed"),
    ("parsed -> routed", "routed"),
    ("routed -> encoded", "encoded"),
    ("encoded -> send start", "send_start"),
    ("send start -> client read", "client"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="msg/s (2000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per run (10)")
    parser.add_argument("--runs", type=int, default=1, help="runs, on one broker (1)")
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--tqbroker-arg", action="append", default=[], help="repeatable")
    parser.add_argument("--json", type=Path, help="write every run's per-stage figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="latency-stages-") as tmp:
        root = Path(tmp)
        trace_path = root / "trace.json"
        os.environ[ENV] = str(trace_path)
        target = TqbrokerTarget(root / "broker", args.tqbroker_arg).start()
        del os.environ[ENV]
        results = []
        try:
            for run in range(args.runs):
                latencies, cpu = _run(target, args, f"stages.{run}")
                target.close()  # its connections closed: the trace is complete
                trace = json.loads(trace_path.read_text())
                results.append(_report(run, trace, latencies, cpu, args))
                if run + 1 < args.runs:
                    os.environ[ENV] = str(trace_path)
                    target.start()
                    del os.environ[ENV]
        finally:
            target.close()
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _run(
    target: TqbrokerTarget, args: argparse.Namespace, queue: str
) -> tuple[list[int], float | None]:
    count = max(int(args.rate * args.seconds), 10)
    client = RawClient.connect(target.endpoint)
    client.declare(queue, durable=False)
    client.close()
    jobs: list[Job] = [
        Consume(queue, count, subscribe_early=True, latency=True),
        PacedPublish(queue, count, args.rate, body_size=args.body_size),
    ]
    result = run_jobs(target.endpoint, jobs, broker_pid=target.pid)
    latencies = result.outcomes[0].latencies_ns
    assert latencies is not None
    return list(latencies), result.broker_cpu


def _report(
    run: int,
    trace: dict[str, list[int]],
    latencies: list[int],
    cpu: float | None,
    args: argparse.Namespace,
) -> dict[str, object]:
    names: list[str] = list(trace["stages"])  # type: ignore[arg-type]
    width = len(names)
    stamps, times = trace["stamps"], trace["times"]
    if len(stamps) != len(latencies):
        sys.exit(f"the trace holds {len(stamps)} messages, the consumer got {len(latencies)}")
    warmup = min(int(args.rate / 4), len(stamps) // 10)  # as the suite
    rows: list[dict[str, int]] = []
    for i in range(warmup, len(stamps)):
        at = {name: times[i * width + k] for k, name in enumerate(names)}
        at["send"] = stamps[i]
        at["client"] = stamps[i] + latencies[i]
        # A message delivered while it was routed (by the publisher's task) was encoded before
        # routing returned: routing ends there for this table.
        at["routed"] = min(at["routed"], at["encoded"])
        chain = [at["send"], *(at[end] for _name, end in STAGES)]
        if any(b < a for a, b in itertools.pairwise(chain)):
            sys.exit(f"message {i}: its stage times are not in order (a stage not traced?)")
        rows.append(at)
    start_of = ["send"] + [end for _name, end in STAGES[:-1]]
    per_stage = {
        name: sorted(row[end] - row[start] for row in rows)
        for (name, end), start in zip(STAGES, start_of, strict=True)
    }
    in_broker = sorted(row["send_start"] - row["read"] for row in rows)
    send_all = sorted(row["sent"] - row["send_start"] for row in rows)
    total = sorted(row["client"] - row["send"] for row in rows)
    p99 = _percentile(total, 0.99)
    pauses = trace["gc_pauses"]
    gcs = [(pauses[i], pauses[i + 1]) for i in range(0, len(pauses), 2)]
    slow = [row for row in rows if row["client"] - row["send"] > p99]
    largest: Counter[str] = Counter()
    in_gc = 0
    for row in slow:
        spans = [
            (row[end] - row[start], name)
            for (name, end), start in zip(STAGES, start_of, strict=True)
        ]
        largest[max(spans)[1]] += 1
        if any(a < row["client"] and b > row["send"] for a, b in gcs):
            in_gc += 1
    load = os.getloadavg()[0]
    cpu_us = "?" if cpu is None else f"{cpu / len(stamps) * 1e6:.0f}"
    print(
        f"-- run {run + 1}: {len(rows)} messages at {args.rate:g} msg/s, load average {load:.2f}, "
        f"broker CPU {cpu_us} us per message"
    )
    print(f"{'stage':<28}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'max ms':>9}")
    figures: dict[str, dict[str, float]] = {}
    summaries = [("end to end", total), ("in broker: read -> send", in_broker)]
    for name, values in [*per_stage.items(), *summaries, ("(send_all)", send_all)]:
        figure = {
            "p50": _percentile(values, 0.5) / 1e6,
            "p99": _percentile(values, 0.99) / 1e6,
            "p999": _percentile(values, 0.999) / 1e6,
            "max": values[-1] / 1e6,
        }
        figures[name] = figure
        print(
            f"{name:<28}{figure['p50']:>9.3f}{figure['p99']:>9.3f}{figure['p999']:>10.3f}"
            f"{figure['max']:>9.2f}"
        )
    gc_ms = sorted(b - a for a, b in gcs)
    print(
        f"slower than the p99 ({p99 / 1e6:.3f} ms): {len(slow)}; their largest stage: "
        + ", ".join(f"{name} {n}" for name, n in largest.most_common())
        + f"; {in_gc} overlapped a GC pause"
    )
    if gc_ms:
        print(
            f"GC pauses: {len(gc_ms)}, median {gc_ms[len(gc_ms) // 2] / 1e6:.3f} ms, "
            f"max {gc_ms[-1] / 1e6:.3f} ms"
        )
    return {
        "run": run + 1,
        "load": load,
        "broker_cpu_s": cpu,
        "stages": figures,
        "slow_largest": dict(largest),
        "slow_in_gc": in_gc,
        "gc_pauses": len(gc_ms),
    }


def _percentile(ordered: list[int], p: float) -> float:
    """Nearest rank, as the suite."""
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)]


if __name__ == "__main__":
    raise SystemExit(main())
