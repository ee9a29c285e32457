"""Storage helpers for tests that drive a backend directly, without a broker's flusher."""

from __future__ import annotations

from tqbroker.backends import Backend


def flush(backend: Backend) -> bool:
    """What the broker's flusher does, now, in this thread: write out and fsync what was
    appended. False when there was nothing to flush."""
    work = backend.begin_flush()
    if work is None:
        return False
    work()
    return True
