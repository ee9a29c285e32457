"""``definitions.cbor``: the durable topology (vhosts, durable exchanges, queues, bindings),
written by group commit.

A change marks the file dirty; the flusher that drives it (``broker/flusher.py``, as for a
storage backend) writes one snapshot of the whole topology in a worker thread (temporary file,
fsync, rename, directory fsync), covering every change made meanwhile. The client that declared,
bound or deleted gets its ``*-ok`` once a write that began after its change has completed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2

from ..fsutil import atomic_write

log = logging.getLogger(__name__)

DEFINITIONS_FILE = "definitions.cbor"


class DefinitionsFile:
    """The definitions file, as a ``Flushable`` (``snapshot`` encodes the topology now)."""

    name = "definitions"

    def __init__(self, data_dir: Path, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.path = data_dir / DEFINITIONS_FILE
        self._snapshot = snapshot
        self._dirty = False
        self._healthy = True

    def load(self) -> dict[str, Any]:
        """What the file holds (empty when there is none yet). Reads only."""
        try:
            loaded = cbor2.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def changed(self) -> None:
        """The topology changed: the next flush writes it."""
        self._dirty = True

    @property
    def needs_flush(self) -> bool:
        return self._dirty

    @property
    def healthy(self) -> bool:
        return self._healthy

    def begin_flush(self) -> Callable[[], None] | None:
        if not self._dirty:
            return None
        data = cbor2.dumps(self._snapshot())
        self._dirty = False

        def work() -> None:
            try:
                atomic_write(self.path, data)
            except OSError:
                self._healthy = False
                self._dirty = True  # the next flush tries again, with the latest snapshot
                raise
            self._healthy = True

        return work

    def write_now(self) -> None:
        """Write the topology at once, on this thread (start-up and shutdown only)."""
        atomic_write(self.path, cbor2.dumps(self._snapshot()))
        self._dirty = False
