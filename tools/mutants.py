"""A curated mutation-testing session: apply each mutant of ``tools/mutant_list.py`` to a
temporary copy of ``src/`` (never to the working tree), run the tests that must catch it against
that copy, and report which mutants were killed and which survived.

Usage::

    python tools/mutants.py                    # every mutant; a table, exit 1 on a surprise
    python tools/mutants.py --only deadletter-same-death-queue-only --only flusher-early-complete
    python tools/mutants.py --area storage     # one area (storage, flusher, settlement, ...)
    python tools/mutants.py --list             # the mutants, nothing run
    python tools/mutants.py --only ID --tests tests/broker/test_queue_semantics.py
                                               # another test selection (does it catch it?)

The copy is imported instead of the working tree through ``PYTHONPATH`` (which comes before the
editable install's path entry), in pytest and in the brokers the tests start as subprocesses.
A mutant is *killed* when its tests fail (or time out), *survived* when they pass. The exit
status is 1 when a mutant expected to be killed survived, or one listed as a known survivor was
killed (the list is stale), or a mutant's snippet is not found exactly once in its file. The
pytest session ``tests/mutation`` (``-m slow``; ``nox -s mutants``) runs the same list.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutant_list import Mutant, mutants  # tools/ is not a package

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
TIMEOUT = 600.0  # seconds per mutant's test run: a hang counts as killed


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    killed: bool
    seconds: float
    detail: str  # the last lines pytest printed

    @property
    def expected(self) -> bool:
        return self.killed == (self.mutant.survives is None)


def load_mutants() -> list[Mutant]:
    """The curated list (``tools/mutant_list.py``), its ids checked to be unique."""
    found = mutants()
    ids = [m.id for m in found]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise ValueError(f"duplicate mutant ids: {sorted(duplicates)}")
    return found


@contextmanager
def source_copy() -> Iterator[Path]:
    """A temporary copy of ``src/`` (its ``src`` directory), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="tqbroker-mutant-") as scratch:
        copy = Path(scratch) / "src"
        shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        yield copy


@contextmanager
def applied(copy: Path, mutant: Mutant) -> Iterator[None]:
    """The mutant written into ``copy`` for the duration of the block, then undone."""
    target = copy / "tqbroker" / mutant.path
    text = target.read_text()
    found = text.count(mutant.original)
    if found != 1:
        raise ValueError(
            f"mutant {mutant.id}: the snippet occurs {found} times in {mutant.path} "
            "(it must occur exactly once: the list is stale)"
        )
    target.write_text(text.replace(mutant.original, mutant.replacement))
    try:
        yield
    finally:
        target.write_text(text)


def run_tests(copy: Path, tests: Sequence[str], timeout: float = TIMEOUT) -> tuple[bool, str]:
    """Run ``tests`` against the tree in ``copy``: (passed, the last lines of the output)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("PYTEST_ADDOPTS", None)
    unique = list(dict.fromkeys(tests))  # a file named twice would run twice
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *unique]
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:g} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, "\n".join(lines[-6:])


def check_copy(copy: Path) -> None:
    """The copy is what gets imported (not the working tree)."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    found = subprocess.run(
        [sys.executable, "-c", "import tqbroker; print(tqbroker.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not found.startswith(str(copy)):
        raise RuntimeError(f"the copy is not imported first: tqbroker comes from {found}")


def run_mutant(
    mutant: Mutant, copy: Path, tests: Sequence[str] | None = None, timeout: float = TIMEOUT
) -> Outcome:
    started = time.monotonic()
    with applied(copy, mutant):
        passed, detail = run_tests(copy, tests or mutant.tests, timeout)
    return Outcome(mutant, not passed, time.monotonic() - started, detail)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="a mutant id (repeatable)")
    parser.add_argument("--area", action="append", default=[], help="an area (repeatable)")
    parser.add_argument("--tests", nargs="+", help="run these tests instead of each mutant's")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per mutant")
    parser.add_argument("--verbose", action="store_true", help="pytest's last lines per mutant")
    args = parser.parse_args(argv)
    selected = load_mutants()
    if args.only:
        unknown = set(args.only) - {m.id for m in selected}
        if unknown:
            parser.error(f"unknown mutant ids: {sorted(unknown)}")
        selected = [m for m in selected if m.id in args.only]
    if args.area:
        selected = [m for m in selected if m.area in args.area]
    if args.list:
        for m in selected:
            note = f"  [survives: {m.survives}]" if m.survives else ""
            print(f"{m.id:44} {m.area:11} {m.path}: {' '.join(m.tests)}{note}")
        return 0
    outcomes = []
    with source_copy() as copy:
        check_copy(copy)
        for mutant in selected:
            outcome = run_mutant(mutant, copy, args.tests, args.timeout)
            outcomes.append(outcome)
            verdict = "killed" if outcome.killed else "SURVIVED"
            flag = "" if outcome.expected or args.tests else "   <-- unexpected"
            print(f"{verdict:9} {outcome.seconds:6.1f} s  {mutant.id}{flag}", flush=True)
            if args.verbose or (flag and not outcome.killed):
                print("    " + outcome.detail.replace("\n", "\n    "), flush=True)
    killed = sum(o.killed for o in outcomes)
    survivors = [o.mutant for o in outcomes if not o.killed]
    print(f"\n{len(outcomes)} mutants: {killed} killed, {len(survivors)} survived")
    for m in survivors:
        print(f"  survived: {m.id} ({m.path}): {m.survives or 'NOT EXPECTED'}")
    if args.tests:
        return 0
    return 0 if all(o.expected for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
