"""Smoke test of the benchmark suite (benchmarks/suite.py): with tiny sizes and tqbroker alone,
every workload runs through the worker processes and the lean client, and the table and the
JSON record come out. It checks that the benchmark code works, not how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "suite.py"

ROWS = [
    "publish, transient, no confirms (1 publisher)",
    "publish, persistent, confirms (window 256)",
    "consume (prefetch 1000, ack every 100, multiple)",
    "end-to-end latency at 2k msg/s, p50",
    "end-to-end latency at 2k msg/s, p99",
    "fanout to 4 queues, 4 consumers (deliveries)",
    "stream publish, confirms (window 256)",
    "stream read from first",
    "memory per queued message, durable",
    "memory per queued message, transient",
    "unclean recovery (kill -9) per GB of backlog",
]


def test_smoke_run_prints_the_table(tmp_path: Path) -> None:
    record = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SUITE), "--smoke", "--rabbitmq", "none", "--json", str(record)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    lines = done.stdout.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["workload", "tqbroker", "broker CPU (tqbroker)", "client CPU (tqbroker)"]
    body = {
        cells[0].rstrip(" *"): cells[1:]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])
        if len(cells) == 4
    }
    assert list(body) == ROWS
    for label, (value, broker_cpu, client_cpu) in body.items():
        number = value.split()[0].rstrip("k").replace(",", "")
        assert float(number) > 0, (label, value)
        assert broker_cpu.endswith("%"), (label, broker_cpu)
        assert client_cpu.endswith("%"), (label, client_cpu)

    data = json.loads(record.read_text())
    assert list(data["targets"]) == ["tqbroker"]
    assert data["errors"] == {}
    medians = {row["key"]: row["results"]["tqbroker"]["median"] for row in data["rows"]}
    assert len(medians) == len(ROWS)
    assert all(value is not None and value > 0 for value in medians.values()), medians
