"""The fuzz targets in the test suite: the checked-in seeds replayed, each target under
Hypothesis (arbitrary bytes and mutated valid inputs), valid client streams decoded exactly
whatever their chunking, and a short coverage-guided atheris run over every target at once.

``-m slow`` runs the long variants: 5,000 Hypothesis examples per target and atheris on each
target for ``TQBROKER_FUZZ_SECONDS`` (120 by default).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .amqp_targets import HANDSHAKE, drive
from .common import check, chunkings
from .strategies import INPUTS, client_streams
from .targets import ORDER, TARGETS

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
# Examples per target in the default set (the log target writes files: fewer).
EXAMPLES = {"log": 60, "frames": 80}
HAS_ATHERIS = importlib.util.find_spec("atheris") is not None


@pytest.mark.parametrize("name", ORDER)
def test_seeds(name: str) -> None:
    """Every checked-in seed passes its target (a regression input added there stays fixed)."""
    seeds = sorted((CORPUS / name).glob("*"))
    assert seeds, f"no seeds for {name}"
    for seed in seeds:
        check(TARGETS[name].run, seed.read_bytes())


def _hypothesis(name: str, examples: int) -> None:
    target = TARGETS[name]
    inputs = st.one_of(INPUTS[name], INPUTS[name], st.binary(max_size=target.max_len))

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(inputs)
    def run(data: bytes) -> None:
        check(target.run, data)

    run()


@pytest.mark.parametrize("name", ORDER)
def test_hypothesis(name: str) -> None:
    _hypothesis(name, EXAMPLES.get(name, 150))


@pytest.mark.slow
@pytest.mark.timeout(0)
@pytest.mark.parametrize("name", ORDER)
def test_hypothesis_long(name: str) -> None:
    _hypothesis(name, 5000)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(client_streams, st.binary(max_size=15))
def test_valid_streams_round_trip(items: list[tuple[bytes, object]], seed: bytes) -> None:
    """What a valid client sends comes out as exactly the methods and contents it encoded,
    however the bytes are chunked."""
    stream = HANDSHAKE + b"".join(frames for frames, _ in items)
    expected = [event for _, event in items if event is not None]
    handshake = drive([HANDSHAKE], eof=False)
    for chunks in ([stream], chunkings(stream, seed)):  # whole (the publish fast path), cut
        seen = drive(chunks)
        assert seen[:6] == handshake
        assert seen[6:] == [*expected, ("eof",)]


def _atheris(target: str, seconds: int, artifacts: Path) -> None:
    command = [sys.executable, "-m", "tests.fuzz.run", "--seconds", str(seconds)]
    command += ["--artifacts", str(artifacts), target]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    stats = [line for line in done.stderr.splitlines() if line.startswith("stat::")]
    print("\n".join(stats))
    assert done.returncode == 0, done.stderr[-6000:]
    assert any("number_of_executed_units" in line for line in stats), done.stderr[-2000:]


@pytest.mark.skipif(not HAS_ATHERIS, reason="atheris is not installed")
def test_atheris_short(tmp_path: Path) -> None:
    """Coverage-guided: every target at once (the first byte picks one) for 10 seconds."""
    _atheris("all", 10, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(0)
@pytest.mark.skipif(not HAS_ATHERIS, reason="atheris is not installed")
@pytest.mark.parametrize("name", ORDER)
def test_atheris_long(name: str, tmp_path: Path) -> None:
    _atheris(name, int(os.environ.get("TQBROKER_FUZZ_SECONDS", "120")), tmp_path)
