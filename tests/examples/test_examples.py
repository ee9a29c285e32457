"""Each example in examples/ runs as its docstring says, in a subprocess (bounded in time, on
loopback only: the examples start their own brokers on ephemeral ports of 127.0.0.1), and prints
what it promises."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, cwd: Path, timeout: float) -> str:
    """Run ``python examples/<name> args`` in ``cwd``; its standard output (it must exit 0)."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == ["embedded.py", "spark_pipeline.py"]


def test_embedded(tmp_path: Path) -> None:
    """A Trio app hosts a broker and talks to it with aio-pika through trio-asyncio."""
    out = run_example("embedded.py", cwd=tmp_path, timeout=60)
    assert list(tmp_path.iterdir()) == []  # its data in a temporary directory, removed
    assert re.search(r"^embedded broker listening on 127\.0\.0\.1:\d+$", out, re.MULTILINE), out
    assert "received: hello 0, hello 1, hello 2" in out


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_spark_pipeline(tmp_path: Path) -> None:
    """Events over AMQP into a partitioned stream, a Spark streaming job that aggregates them
    into another stream, the results read back with ``python -m tqbroker consume``."""
    if _java() is None:
        pytest.skip("the Spark example needs Java 17+ (java on PATH or JAVA_HOME)")
    out = run_example(
        "spark_pipeline.py",
        "--start-broker",
        "--events",
        "50",
        cwd=tmp_path,
        timeout=540,
    )
    assert "published 50 events to 'events' over AMQP" in out
    wrote = re.search(r"^the Spark job wrote (\d+) window results to 'event-counts'$", out, re.M)
    assert wrote is not None, out
    results = [
        line for line in out.splitlines() if line.startswith("{") and '"events"' in line
    ]  # what `python -m tqbroker consume` printed: the windows' JSON
    assert len(results) == int(wrote.group(1)) > 0, out
    counts = [re.search(r'"events":(\d+)', line) for line in results]
    assert sum(int(count.group(1)) for count in counts if count) == 50, out
