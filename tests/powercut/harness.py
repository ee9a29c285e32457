"""Record a workload through the recording facade, then check recovery on every crash state.

A ``Workload`` has ``run(data_dir, recorder)`` (the real work, marking what it was promised)
and ``check(data_dir, marks) -> Counter`` (recovery on a crash state: the anomalies it finds,
by kind). ``explore`` runs it and returns Jepsen-style counts: states explored, and the
anomalies (lost, resurrected, corrupt, unexpected, duplicated, failed-start), with examples.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqbroker.storage_env import FileSystem

from .crashstates import CrashState, crash_states, materialize
from .recorder import Op, Recorder

KINDS = ("lost", "resurrected", "corrupt", "unexpected", "duplicated", "failed_start")


class Workload(Protocol):
    name: str

    def run(self, data_dir: Path, recorder: Recorder) -> None: ...

    def check(
        self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem
    ) -> Counter[str]: ...


@dataclass
class Report:
    workload: str
    operations: int = 0
    states: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        counts = " ".join(f"{kind}={self.counts[kind]}" for kind in KINDS)
        return (
            f"power-cut {self.workload}: {self.operations} operations recorded, "
            f"{self.states} crash states explored in {self.seconds:.1f} s: {counts}"
        )

    @property
    def ok(self) -> bool:
        return not any(self.counts[kind] for kind in KINDS)


class NoSync(FileSystem):
    """Recovery on a crash state: real files, no fsyncs (the state is thrown away after)."""

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync(self, fd: int) -> None:
        pass


def scratch_space(directory: Path) -> Path:
    """Where crash states are materialized: tmpfs when there is one (cheap creates and
    unlinks), else ``directory``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="tqbroker-powercut-", dir=shm))
    return directory


def record(workload: Workload, directory: Path) -> list[Op]:
    data_dir = directory / "recorded"
    data_dir.mkdir()
    recorder = Recorder(data_dir, sync_delay=getattr(workload, "sync_delay", 0.0))
    workload.run(data_dir, recorder)
    return recorder.ops


def explore(
    workload: Workload,
    directory: Path,
    *,
    points: int | None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Report:
    started = time.monotonic()
    ops = record(workload, directory)
    report = Report(workload.name, operations=len(ops))
    scratch = scratch_space(directory)
    try:
        for n, state in enumerate(crash_states(ops, points=points, seed=seed)):
            target = scratch / f"crash-{n}"
            target.mkdir()
            materialize(state, target)
            found, found_text = _check(workload, target, state.marks)
            _tally(report, state, len(ops), found, found_text)
            shutil.rmtree(target)
    finally:
        if scratch != directory:
            shutil.rmtree(scratch, ignore_errors=True)
    report.seconds = time.monotonic() - started
    log(str(report))
    for example in report.examples:
        log("  " + example)
    return report


def _check(
    workload: Workload, target: Path, marks: list[dict[str, Any]]
) -> tuple[Counter[str], str]:
    """Recovery on a crash state (real files, no fsyncs: the state is thrown away after)."""
    try:
        return workload.check(target, marks, NoSync()), ""
    except Exception:  # recovery itself failed: the broker would not start
        return Counter(failed_start=1), traceback.format_exc(limit=-4)


def _tally(
    report: Report, state: CrashState, operations: int, found: Counter[str], text: str
) -> None:
    report.states += 1
    report.counts.update(found)
    kinds = [kind for kind in KINDS if found[kind]]
    if kinds and sum(kinds[0] in e for e in report.examples) < 2:
        counts = {k: v for k, v in found.items() if v}
        report.examples.append(
            f"point {state.point}/{operations} variant {state.variant}: {counts} {text}"
        )
