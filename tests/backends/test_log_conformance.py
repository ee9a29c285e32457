"""The backend conformance suite against the ``log`` backend (durable: restarts and crashes)."""

from __future__ import annotations

from pathlib import Path

from tqbroker.backends.log import LogBackend
from tqbroker.testing.conformance import BackendConformance


class TestLogBackend(BackendConformance):
    def make_backend(self, data_dir: Path) -> LogBackend:
        # Small segments so that rolling and segment deletion happen within the suite.
        return LogBackend(segment_bytes=64 * 1024, index_interval_bytes=512)
