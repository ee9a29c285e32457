"""The benchmark suite's results and how they are shown.

Responsibilities:
- ``Results``: every run's measures and errors, per target and row; per row the median run
  (the lower middle one for an even count), with that run's CPU figures;
- ``table``: one Markdown table (workload | tqbroker | RabbitMQ | ratio | broker CPU | client
  CPU; CPU as seconds and as a share of one core over the run's wall time, so a reader sees who
  was the limit);
- ``notes``: what to keep in mind reading it (a busy load generator or machine, failures);
- ``record``: the ``--json`` record of every run, the machine, the versions and the load
  average.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import asdict, dataclass, field

from procstats import machine
from targets import Target
from workloads import ROWS_OF, Measure, Settings

CLIENT_LIMIT = 0.8  # a load generator process busier than this may have been the limit
OTHER_LIMIT = 0.5  # more CPU than this (cores) outside broker and clients: a busy machine


@dataclass(frozen=True)
class Row:
    """A line of the table: one figure of a workload."""

    key: str
    label: str
    unit: str  # msg/s, ms, B/msg, s/GB
    higher_is_better: bool = True


ROWS = [
    Row("publish_transient", "publish, transient, no confirms (1 publisher)", "msg/s"),
    Row("publish_persistent", "publish, persistent, confirms (window 256)", "msg/s"),
    Row("consume", "consume (prefetch 1000, ack every 100, multiple)", "msg/s"),
    Row("latency_p50", "end-to-end latency at 2k msg/s, p50 *", "ms", False),
    Row("latency_p99", "end-to-end latency at 2k msg/s, p99 *", "ms", False),
    Row("latency_p999", "end-to-end latency at 2k msg/s, p99.9 *", "ms", False),
    Row("fanout", "fanout to 4 queues, 4 consumers (deliveries)", "msg/s"),
    Row("fanout_16", "fanout to 16 queues, 16 consumers (deliveries)", "msg/s"),
    Row("stream_publish", "stream publish, confirms (window 256)", "msg/s"),
    Row("stream_read", "stream read from first", "msg/s"),
    Row("memory_durable", "memory per queued message, durable *", "B/msg", False),
    Row("memory_transient", "memory per queued message, transient *", "B/msg", False),
    Row("recovery", "unclean recovery (kill -9) per GB of backlog *", "s/GB", False),
]


@dataclass
class Results:
    """Every run's measures and errors, per target and row."""

    measures: dict[str, dict[str, list[Measure]]] = field(default_factory=dict)
    errors: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def add(self, target: str, measures: dict[str, Measure]) -> None:
        for key, measure in measures.items():
            self.measures.setdefault(target, {}).setdefault(key, []).append(measure)

    def fail(self, target: str, workload: str, error: str) -> None:
        self.errors.setdefault(target, {}).setdefault(workload, []).append(error)

    def median(self, target: str, key: str) -> Measure | None:
        """The median run (the lower middle one for an even count)."""
        runs = sorted(self.measures.get(target, {}).get(key, []), key=lambda m: m.value)
        return runs[(len(runs) - 1) // 2] if runs else None


def find_row(key: str) -> Row:
    """The row of the figure ``key``."""
    return next(row for row in ROWS if row.key == key)


def format_value(value: float, unit: str) -> str:
    """A figure as the table shows it."""
    if unit == "msg/s":
        return f"{value / 1000:.1f}k msg/s" if value >= 1000 else f"{value:.0f} msg/s"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "B/msg":
        return f"{value:,.0f} B"
    return f"{value:.2f} {unit}"


def _cpu(seconds: float | None, wall: float) -> str:
    if seconds is None:
        return "?"
    shown = f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    return f"{shown} {100 * seconds / wall:.0f}%" if wall > 0 else shown


def table(results: Results, targets: list[Target], workloads: list[str]) -> str:
    """The Markdown table of medians; with two targets, the ratio first/second."""
    rows_run = {key for name in workloads for key in ROWS_OF[name]}
    names = [t.name for t in targets]
    header = ["workload", *names]
    if len(names) == 2:
        header.append("ratio")
    joined = " / ".join(names)
    header += [f"broker CPU ({joined})", f"client CPU ({joined})"]
    lines = [header]
    for row in ROWS:
        if row.key not in rows_run:
            continue
        medians = [results.median(name, row.key) for name in names]
        cells = [row.label]
        for name, median in zip(names, medians, strict=True):
            if median is not None:
                cells.append(format_value(median.value, row.unit))
            elif any(results.errors.get(name, {}).values()) and _failed(results, name, row.key):
                cells.append("error")
            else:
                cells.append("n/a")
        if len(names) == 2:
            first, second = medians
            if first is not None and second is not None and second.value:
                cells.append(f"{first.value / second.value:.2f}")
            else:
                cells.append("-")
        cells.append(" / ".join(_cpu(m.broker_cpu, m.wall) if m else "-" for m in medians))
        cells.append(" / ".join(_cpu(m.client_cpu, m.wall) if m else "-" for m in medians))
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for i, line in enumerate(lines):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def _failed(results: Results, target: str, key: str) -> bool:
    return any(key in ROWS_OF[w] for w in results.errors.get(target, {}))


def notes(results: Results, targets: list[Target], settings: Settings) -> list[str]:
    """The lines under the table: how to read it, each target's notes, medians that a load
    generator process or the rest of the machine may have limited, and every failure."""
    lines = [
        "medians of "
        f"{settings.runs} run(s); {settings.body_size} B bodies; "
        f"CPU: seconds (share of one core over the run)",
    ]
    if len(targets) == 2:
        lines.append(f"ratio = {targets[0].name} / {targets[1].name}")
    lines.append("* lower is better")
    for target in targets:
        lines += [f"{target.name}: {note}" for note in target.notes]
    for row in ROWS:
        for target in targets:
            median = results.median(target.name, row.key)
            if median is None:
                continue
            if median.busiest_worker > CLIENT_LIMIT:
                lines.append(
                    f"{target.name} {row.key}: a load generator process was busy "
                    f"{100 * median.busiest_worker:.0f}% of a core: it may have set the pace"
                )
            if median.wall > 0 and median.other_cpu / median.wall > OTHER_LIMIT:
                lines.append(
                    f"{target.name} {row.key}: {100 * median.other_cpu / median.wall:.0f}% of "
                    "a core went to other processes or the kernel meanwhile: a busy machine?"
                )
    for name, failures in results.errors.items():
        for workload, errors in failures.items():
            lines += [f"{name} {workload} failed: {error}" for error in errors]
    return lines


def record(
    results: Results,
    targets: list[Target],
    workloads: list[str],
    settings: Settings,
    *,
    versions: dict[str, str],
    load_before: tuple[float, float, float],
) -> dict[str, object]:
    """The ``--json`` record: the date, the machine, the load average before and now, the
    settings, and per row each target's median and every run."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "settings": asdict(settings),
        "workloads": workloads,
        "targets": {
            t.name: {"version": versions[t.name], "url": t.endpoint.url, "notes": t.notes}
            for t in targets
        },
        "rows": [
            {
                **asdict(row),
                "results": {
                    t.name: {
                        "median": _median_value(results, t.name, row.key),
                        "runs": [
                            asdict(m) for m in results.measures.get(t.name, {}).get(row.key, [])
                        ],
                    }
                    for t in targets
                },
            }
            for row in ROWS
            if any(row.key in ROWS_OF[w] for w in workloads)
        ],
        "errors": results.errors,
    }


def _median_value(results: Results, target: str, key: str) -> float | None:
    median = results.median(target, key)
    return median.value if median else None
