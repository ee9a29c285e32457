"""``benchmarks/consumer_crowd.py`` against a broker of this tree: with 20k consumers on one
queue (over 100 channels of one connection) deliveries go at least at 0.3 of the rate of one
consumer, measured in the same run (a ratio, not a time: both halves run on the same loaded
machine). The delivery pass that walked every consumer per message made it ~0.01."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "consumer_crowd.py"

pytestmark = pytest.mark.timeout(300)


def test_twenty_thousand_consumers_deliver_near_the_rate_of_one(tmp_path: Path) -> None:
    out = tmp_path / "crowd.json"
    done = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--crowds", "1,20000", "--channels", "100"),
            *("--messages", "100000", "--seconds", "10", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    one, crowd = figures["crowds"]
    assert (one["consumers"], crowd["consumers"]) == (1, 20000)
    assert figures["ratio"] >= 0.3, done.stdout
    assert one["delivered"] == crowd["delivered"] == 100000, done.stdout
