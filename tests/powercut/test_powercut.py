"""The power-cut simulation (CrashMonkey/ALICE style): each workload's file operations are
recorded, every disk state a power cut could leave is built from the trace, and recovery runs
on each: it must start, lose no confirmed message, resurrect no acked one (nor a deleted queue),
deliver no corrupt one. The counts are printed Jepsen style (``-s`` shows them).

Default set: a sample of crash points per workload (>= 100 states in all, a few seconds);
``-m slow``: every crash point (>= 1,000 states per run). Both also crash the recovery itself
(``recrash.py``): a second power cut while recovering from a first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from .broker_workload import BrokerWorkload
from .harness import Report, Workload, explore
from .recrash import explore_twice
from .replica_workload import ReplicaWorkload, RestartWorkload
from .workloads import DefinitionsWorkload, QueueWorkload, StreamWorkload


@pytest.fixture(autouse=True)
def quiet_recovery() -> Iterator[None]:
    """Recovery logs every torn tail it truncates: thousands of lines, all expected."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def run(workload: Workload, tmp_path: Path, points: int | None, seed: int = 0) -> Report:
    report = explore(workload, tmp_path, points=points, seed=seed)
    assert report.ok, f"{report}\n" + "\n".join(report.examples)
    return report


def test_power_cuts_default_set(tmp_path: Path) -> None:
    """Every workload, a sample of crash points: >= 100 crash states."""
    states = 0
    plan: list[tuple[Workload, int | None]] = [
        (QueueWorkload(), 40),
        (StreamWorkload(), 40),
        (ReplicaWorkload(), 40),
        (RestartWorkload(), 30),
        (DefinitionsWorkload(), None),
        # The relaxed policies: recovery consistent (starts, nothing corrupt), losses allowed.
        (QueueWorkload(fsync="never"), 20),
        (StreamWorkload(fsync="never"), 20),
        (BrokerWorkload(), 8),
    ]
    for n, (workload, points) in enumerate(plan):
        directory = tmp_path / str(n)
        directory.mkdir()
        states += run(workload, directory, points).states
    print(f"power-cut default set: {states} crash states, every one recovered correctly")
    assert states >= 100


@pytest.mark.parametrize(
    "workload", [QueueWorkload(), StreamWorkload(), ReplicaWorkload()], ids=lambda w: w.name
)
def test_power_cuts_during_recovery(tmp_path: Path, workload: Workload) -> None:
    """A second power cut while recovering from a first: 20 damaged first states, 15 crash
    points in each recovery."""
    report = explore_twice(workload, tmp_path, first=20, points=15)
    assert report.ok, f"{report}\n" + "\n".join(report.examples)
    assert report.states >= 100


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload",
    [QueueWorkload(), StreamWorkload(), ReplicaWorkload(), RestartWorkload()],
    ids=lambda w: w.name,
)
def test_power_cuts_during_recovery_many(tmp_path: Path, workload: Workload) -> None:
    report = explore_twice(workload, tmp_path, first=120, points=40)
    assert report.ok, f"{report}\n" + "\n".join(report.examples)
    assert report.states >= 1000


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload",
    [
        QueueWorkload(rounds=16),
        StreamWorkload(rounds=18),
        ReplicaWorkload(rounds=12),
        RestartWorkload(rounds=10),
        DefinitionsWorkload(versions=12),
    ],
    ids=lambda w: w.name,
)
def test_power_cuts_every_crash_point(tmp_path: Path, workload: Workload) -> None:
    report = run(workload, tmp_path, None)
    if not isinstance(workload, DefinitionsWorkload):
        assert report.states >= 1000


@pytest.mark.slow
def test_power_cuts_through_the_broker(tmp_path: Path) -> None:
    assert run(BrokerWorkload(messages=16), tmp_path, 60).states >= 200
