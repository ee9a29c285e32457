"""The backend conformance suite (``tqbroker.testing.conformance``) against the in-memory
reference backend."""

from __future__ import annotations

from pathlib import Path

from tqbroker.backends.memory import MemoryBackend
from tqbroker.testing.conformance import (
    CASES,
    BackendConformance,
    run_conformance,
    stateful_settings,
    stateful_test_case,
)


class TestMemoryBackend(BackendConformance):
    def make_backend(self, data_dir: Path) -> MemoryBackend:
        return MemoryBackend()


class TestMemoryBackendPagingOut(BackendConformance):
    """The same contract with all but two ready messages of each queue paged out to disk."""

    def make_backend(self, data_dir: Path) -> MemoryBackend:
        return MemoryBackend(page_window=2)


def test_stateful_test_case_builder() -> None:
    """``stateful_test_case`` gives a runnable unittest class (few examples: the full run is the
    ``stateful`` case above)."""
    test_case = stateful_test_case(
        lambda data_dir: MemoryBackend(),
        settings=stateful_settings(max_examples=5, stateful_step_count=10),
    )
    result = test_case("runTest").run()
    assert result is not None
    assert result.wasSuccessful(), result.failures + result.errors


def test_run_conformance_without_pytest(tmp_path: Path) -> None:
    """``run_conformance`` runs the cases that apply to a non-durable backend."""
    ran = run_conformance(
        lambda data_dir: MemoryBackend(), tmp_path, skip=("non_unacked_ids_ignored", "stateful")
    )
    expected = [
        case.name
        for case in CASES
        if case.applies(False) and case.name not in ("non_unacked_ids_ignored", "stateful")
    ]
    assert ran == expected
    assert "restart_keeps_nothing" in ran
    assert "restart_recovers_persistent" not in ran
