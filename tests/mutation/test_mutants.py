"""The curated mutation session (``tools/mutants.py``, list in ``tools/mutant_list.py``) as
slow tests, one per mutant: each is applied to a temporary copy of ``src/`` and the tests it
names must fail on it. Known survivors are ``xfail(strict=True)`` with the reason from the list
(a survivor that starts being killed fails the run: the list is stale). Run with
``pytest -m slow tests/mutation`` or ``nox -s mutants`` (the same list, as a table)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mutants as runner  # tools/mutants.py (tools/ is not a package)
from mutant_list import Mutant

pytestmark = [pytest.mark.slow, pytest.mark.timeout(runner.TIMEOUT + 60)]


@pytest.fixture(scope="module")
def source_copy() -> Iterator[Path]:
    with runner.source_copy() as copy:
        runner.check_copy(copy)
        yield copy


def _params() -> Iterator[object]:
    for mutant in runner.load_mutants():
        marks = [pytest.mark.xfail(strict=True, reason=mutant.survives)] if mutant.survives else []
        yield pytest.param(mutant, id=mutant.id, marks=marks)


@pytest.mark.parametrize("mutant", list(_params()))
def test_the_tests_kill_the_mutant(mutant: Mutant, source_copy: Path) -> None:
    outcome = runner.run_mutant(mutant, source_copy)
    assert outcome.killed, (
        f"mutant {mutant.id} survived {' '.join(mutant.tests)}:\n"
        f"  {mutant.path}: {mutant.original!r} -> {mutant.replacement!r}\n{outcome.detail}"
    )
