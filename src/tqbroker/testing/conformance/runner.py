"""Running the conformance cases: ``CASES`` in order, ``run_conformance`` (without pytest) and
``BackendConformance`` (the pytest runner: one ``test_conformance[<case>]`` per case)."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from ...backends.base import Backend
from ...backends.streams import StreamBackend
from .cases_content import CONTENT_CASES
from .cases_durability import DURABILITY_CASES
from .cases_queue import QUEUE_CASES
from .cases_streams import STREAM_CASES
from .harness import BackendFactory, ConformanceCase
from .stateful import STATEFUL_CASES

log = logging.getLogger(__name__)

CASES: list[ConformanceCase] = [
    *QUEUE_CASES,
    *CONTENT_CASES,
    *DURABILITY_CASES,
    *STREAM_CASES,
    *STATEFUL_CASES,
]
"""Every case, in the order they run."""


def run_conformance(
    factory: BackendFactory, directory: Path, *, skip: Sequence[str] = ()
) -> list[str]:
    """Run every case that applies to the factory's backend (each in its own subdirectory of
    ``directory``), except those named in ``skip``; return the names of the cases run. The first
    failure propagates."""
    backend = factory(directory)
    durable, streams = backend.durable, isinstance(backend, StreamBackend)
    ran: list[str] = []
    for case in CASES:
        if case.name in skip or not case.applies(durable, streams):
            continue
        case.function(factory, directory / case.name)
        ran.append(case.name)
    return ran


class BackendConformance:
    """Subclass as ``Test...`` and override ``make_backend`` to run every case under pytest (see
    the package docstring); ``known_failures`` maps case names to reasons (strict xfail)."""

    known_failures: ClassVar[Mapping[str, str]] = {}

    def make_backend(self, data_dir: Path) -> Backend:
        """A fresh, unopened backend for ``data_dir`` (the ``BackendFactory``): override this."""
        raise NotImplementedError(
            f"{type(self).__name__} overrides neither make_backend nor the conformance_factory"
            " fixture"
        )

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "conformance_case" not in metafunc.fixturenames:
            return
        unknown = set(self.known_failures) - {case.name for case in CASES}
        if unknown:
            raise ValueError(f"known_failures names unknown cases: {sorted(unknown)}")
        kind = self._kind()
        params = []
        for case in CASES:
            if kind is not None and not case.applies(*kind):
                continue  # not applicable to this kind of backend: not generated at all
            reason = self.known_failures.get(case.name)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(case, id=case.name, marks=marks))
        metafunc.parametrize("conformance_case", params)

    def _kind(self) -> tuple[bool, bool] | None:
        """Whether ``make_backend`` builds a durable backend, and one that offers streams
        (None if it cannot tell, e.g. when a subclass parametrizes ``conformance_factory``
        instead)."""
        with tempfile.TemporaryDirectory() as tmp:
            try:
                backend = self.make_backend(Path(tmp))
            except NotImplementedError:
                return None
            return bool(backend.durable), isinstance(backend, StreamBackend)

    @pytest.fixture
    def conformance_factory(self) -> BackendFactory:
        """The factory under test: ``make_backend`` unless a subclass overrides this fixture
        (e.g. with ``params`` to run one class against several backends)."""
        return self.make_backend

    def test_conformance(
        self,
        conformance_case: ConformanceCase,
        conformance_factory: BackendFactory,
        tmp_path: Path,
    ) -> None:
        backend = conformance_factory(tmp_path)
        if not conformance_case.applies(backend.durable, isinstance(backend, StreamBackend)):
            pytest.skip(f"for {conformance_case.applies_to} backends only")
        conformance_case.function(conformance_factory, tmp_path / "data")
