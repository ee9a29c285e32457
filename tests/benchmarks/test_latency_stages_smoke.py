"""Smoke test of ``benchmarks/latency_stages.py``: a second of the latency workload against a
tqbroker with ``TQBROKER_LATENCY_TRACE`` set; every message is traced through every stage, in
order (the script refuses a trace that is not), and the table comes out. It checks that the
tracing works, not how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "latency_stages.py"


def test_latency_stages_traces_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "stages.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "1", "--rate", "500", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for stage in ("client send -> read", "routed -> encoded", "encoded -> send start"):
        assert stage in done.stdout
    (run,) = json.loads(out.read_text())
    stages = run["stages"]
    assert stages["end to end"]["p50"] > 0
    assert all(figure["p50"] >= 0 for figure in stages.values())
