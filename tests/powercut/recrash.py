"""Crashes during recovery: a power cut while the broker recovers from a first one.

Recovery writes too (it cuts torn tails, deletes the segments after a cut, rebuilds indexes,
rewrites the checkpoint, reserves a delivery window, leaves a clean marker at the stop). For a
sample of first crash states, the recovery run (the workload's ``check``) is itself recorded,
starting from that state as if it were all durable, and every state a second power cut could
leave is checked again against the promises of the first run (the recovery run makes none).
Only for workloads whose ``check`` settles nothing (the backend-level ones: it pops without
acking and reads streams).
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .crashstates import CrashState, crash_states, materialize
from .harness import Report, Workload, _check, _tally, record, scratch_space
from .recorder import Op, Recorder

# First-crash variants where recovery has the most to do (cut, rebuild).
DAMAGED = ("torn", "hole0", "hole1", "zeroed", "reorder1", "prefix")


def explore_twice(
    workload: Workload,
    directory: Path,
    *,
    first: int,
    points: int | None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Report:
    """``first`` first-crash states (damaged ones), each with up to ``points`` second crash
    points; the report counts the second crash states."""
    started = time.monotonic()
    ops = record(workload, directory)
    report = Report(f"{workload.name} (crash during recovery)", operations=len(ops))
    candidates = [s for s in crash_states(ops, points=None, seed=seed) if s.variant in DAMAGED]
    sample = random.Random(seed).sample(candidates, min(first, len(candidates)))
    scratch = scratch_space(directory)
    try:
        for n, state in enumerate(sample):
            base = scratch / f"first-{n}"
            base.mkdir()
            materialize(state, base)
            second_ops, adopted = _record_recovery(workload, base, state)
            report.operations += len(second_ops) - adopted
            _explore_second(workload, scratch, n, state, second_ops, adopted, points, seed, report)
            shutil.rmtree(base)
    finally:
        if scratch != directory:
            shutil.rmtree(scratch, ignore_errors=True)
    report.seconds = time.monotonic() - started
    log(str(report))
    for example in report.examples:
        log("  " + example)
    return report


def _record_recovery(workload: Workload, base: Path, state: CrashState) -> tuple[list[Op], int]:
    recorder = Recorder(base, adopt=True)
    workload.check(base, state.marks, recorder)  # its findings count in the one-crash runs
    return recorder.ops, recorder.adopted


def _explore_second(
    workload: Workload,
    scratch: Path,
    n: int,
    state: CrashState,
    ops: list[Op],
    adopted: int,
    points: int | None,
    seed: int,
    report: Report,
) -> None:
    for m, second in enumerate(crash_states(ops, points=points, seed=seed + n, start=adopted)):
        target = scratch / f"second-{n}-{m}"
        target.mkdir()
        materialize(second, target)
        found, text = _check(workload, target, state.marks)
        second.variant = f"{state.variant}@{state.point}, then {second.variant}"
        _tally(report, second, len(ops), found, text)
        shutil.rmtree(target)
