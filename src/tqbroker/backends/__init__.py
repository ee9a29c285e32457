"""The API for storage backends: everything a backend may import from tqbroker.

A backend is registered under the entry-point group ``tqbroker.backends`` and implements
``Backend`` (classic queues, ``QueueStore``) and optionally ``StreamBackend`` (streams,
``StreamLog``), and proves it with the conformance suite (``BackendConformance``,
``run_conformance``; imported on first use, it needs pytest and Hypothesis). A backend's
``open`` may take the broker's ``StorageEnv``: the file system to do durable file operations
through. Everything else in tqbroker is private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..model import Message
from ..protocol.methods import BasicProperties
from ..storage_env import StorageEnv
from .base import FLUSH_FIRST, Backend, FlushFirst, Popped, QueueStore
from .streams import CompactionPolicy, StreamBackend, StreamLog, StreamRecord

if TYPE_CHECKING:
    from ..testing.conformance import BackendConformance, run_conformance

__all__ = [
    "FLUSH_FIRST",
    "Backend",
    "BackendConformance",
    "BasicProperties",
    "CompactionPolicy",
    "FlushFirst",
    "Message",
    "Popped",
    "QueueStore",
    "StorageEnv",
    "StreamBackend",
    "StreamLog",
    "StreamRecord",
    "run_conformance",
]

_CONFORMANCE = ("BackendConformance", "run_conformance")


def __getattr__(name: str) -> Any:
    # The conformance suite needs pytest and Hypothesis: imported only when asked for.
    if name in _CONFORMANCE:
        from ..testing import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module 'tqbroker.backends' has no attribute {name!r}")
