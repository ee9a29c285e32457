"""``benchmarks/pipelined_topology.py`` runs against a broker of this tree (a small N: the
figures at 100k, and the comparison with an older tree, are the probe's to print, not a test's
to time): each phase reports the broker's CPU and the canary's round trips, which went on
during every phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pipelined_topology.py"

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("durable", [False, True])
def test_the_probe_measures_each_phase(tmp_path: Path, durable: bool) -> None:
    out = tmp_path / "topology.json"
    command = [sys.executable, str(SCRIPT), "--queues", "2000", "--idle", "0.5"]
    command += ["--json", str(out), *(["--durable"] if durable else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert (figures["queues"], figures["durable"]) == (2000, durable)
    phases = {phase["name"]: phase for phase in figures["phases"]}
    assert list(phases) == ["declare", "consume", "idle", "close"]
    for phase in phases.values():
        assert phase["cpu_seconds"] > 0 or phase["name"] == "idle", done.stdout
        assert phase["trips"] >= 1, done.stdout
    assert "| declare |" in done.stdout
