"""Smoke test of the benchmark suite (benchmarks/suite.py): with tiny sizes and tqbroker alone,
every workload runs through the worker processes and the lean client, and the table and the
JSON record come out; then, with ``--mode both``, the workload whose load generator differs
between the modes (fanout), a table per mode. It checks that the benchmark
code works, not how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A minute or more on 2 cores, and what it guards (the benchmark scripts still run) matters only
# to whoever runs ``nox -s bench``: with the slow tests.
pytestmark = pytest.mark.slow

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "suite.py"

ROWS = [
    "publish, transient, no confirms (1 publisher)",
    "publish, persistent, confirms (window 256)",
    "consume (prefetch 1000, ack every 100, multiple)",
    "end-to-end latency at 2k msg/s, p50",
    "end-to-end latency at 2k msg/s, p99",
    "end-to-end latency at 2k msg/s, p99.9",
    "fanout to 4 queues, 4 consumers (deliveries)",
    "fanout to 16 queues, 16 consumers (deliveries)",
    "stream publish, confirms (window 256)",
    "stream read from first",
    "memory per queued message, durable",
    "memory per queued message, transient",
    "unclean recovery (kill -9) per GB of backlog",
]


def _suite(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SUITE), "--smoke", "--rabbitmq", "none", *args],
        capture_output=True,
        text=True,
        timeout=180,  # a safety net: about 30 s on an idle machine, more on a busy one
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _check_table(lines: list[str], rows: list[str]) -> None:
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["workload", "tqbroker", "broker CPU (tqbroker)", "client CPU (tqbroker)"]
    body = {
        cells[0].rstrip(" *"): cells[1:]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])
        if len(cells) == 4
    }
    assert list(body) == rows
    for label, (value, broker_cpu, client_cpu) in body.items():
        number = value.split()[0].rstrip("k").replace(",", "")
        assert float(number) > 0, (label, value)
        assert broker_cpu.endswith("%"), (label, broker_cpu)
        assert client_cpu.endswith("%"), (label, client_cpu)


def test_smoke_run_prints_the_table(tmp_path: Path) -> None:
    record = tmp_path / "bench.json"
    _check_table(_suite(tmp_path, "--json", str(record)).splitlines(), ROWS)

    data = json.loads(record.read_text())
    assert data["settings"]["mode"] == "multi"
    (fanout_16,) = [row for row in data["rows"] if row["key"] == "fanout_16"]
    (run,) = fanout_16["results"]["tqbroker"]["runs"]
    assert run["detail"]["messages"] == 16 * (2000 // 4)
    assert run["detail"]["processes"] == 3  # a publisher, two processes of 8 consumers each
    assert list(data["targets"]) == ["tqbroker"]
    assert data["errors"] == {}
    medians = {row["key"]: row["results"]["tqbroker"]["median"] for row in data["rows"]}
    assert len(medians) == len(ROWS)
    assert all(value is not None and value > 0 for value in medians.values()), medians


def test_both_modes_print_a_table_each(tmp_path: Path) -> None:
    record = tmp_path / "bench.json"
    out = _suite(tmp_path, "--mode", "both", "--workloads", "fanout", "--json", str(record))
    rows = ["fanout to 4 queues, 4 consumers (deliveries)"]
    titles = [line for line in out.splitlines() if line.startswith("### mode ")]
    assert [t.split(":")[0] for t in titles] == ["### mode multi", "### mode single"]
    for part in out.split("### mode ")[1:]:
        lines = [line for line in part.splitlines() if line.startswith("|")]
        _check_table(lines, rows)

    data = json.loads(record.read_text())
    assert list(data) == ["multi", "single"]
    for mode, found in data.items():
        assert found["settings"]["mode"] == mode
        assert found["errors"] == {}
        (fanout,) = found["rows"]
        (run,) = fanout["results"]["tqbroker"]["runs"]
        assert run["detail"]["messages"] == 4 * 2000
        # one publisher process; consumers: two processes of a connection per queue (multi),
        # or one process and connection for all (single)
        assert run["detail"]["processes"] == (3 if mode == "multi" else 2)
