"""A node's disk in the cluster simulation (``cluster_sim``): the power-cut ``Recorder`` (every
mutating file operation under the node's data directory, with its bytes) that can also stall.

- a power cut: ``crash_point()`` is the moment the power goes (the operations recorded so far);
  ``after_power_cut(point)`` replaces the data directory with what a power cut then leaves
  (``tests.powercut.crashstates``, variant ``synced`` by default: every byte and directory
  entry not fsync'd is gone) and returns the disk the node restarts on (recording again, from
  that state);
- a stuck disk: after ``stall()`` every fsync blocks (in the worker thread that called it)
  until ``unstall()``; ``stalled_syncs`` counts the fsyncs that waited. Writes still go
  through: a hung disk takes writes into the page cache and never makes them durable. An
  fsync called on the Trio thread itself is not held (every node of the simulation shares
  that thread: holding it would freeze them all, where a real stuck disk freezes one node): it
  goes through and is recorded in ``loop_syncs`` (where it was called from), a defect a test
  can assert against.
"""

from __future__ import annotations

import shutil
import threading
import traceback
from pathlib import Path
from typing import Any

import trio

from tests.powercut.crashstates import crash_state, materialize
from tests.powercut.recorder import Recorder


class SimDisk(Recorder):
    def __init__(self, root: Path, *, adopt: bool = False) -> None:
        super().__init__(root, adopt=adopt)
        self._flowing = threading.Event()
        self._flowing.set()
        self.stalled_syncs = 0
        self.loop_syncs: list[str] = []  # fsyncs on the Trio thread while stalled: their callers

    # -- a stuck disk ----------------------------------------------------------------------

    def stall(self) -> None:
        """From now on every fsync blocks until ``unstall``."""
        self._flowing.clear()

    def unstall(self) -> None:
        self._flowing.set()

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    def _sync(self, fd: int, real: Any) -> None:
        if not self._flowing.is_set():
            if trio.lowlevel.in_trio_run():
                stack = traceback.extract_stack(limit=12)[:-2]
                self.loop_syncs.append(" <- ".join(f"{f.name}" for f in reversed(stack)))
            else:
                with self._lock:
                    self.stalled_syncs += 1
                self._flowing.wait()
        super()._sync(fd, real)

    # -- a power cut -----------------------------------------------------------------------

    def crash_point(self) -> int:
        """The power goes now: the operations that happened before it."""
        return len(self.ops)

    def after_power_cut(self, point: int, variant: str = "synced", seed: int = 0) -> SimDisk:
        """The data directory as a power cut at ``point`` leaves it (the node must be stopped:
        nothing writes here any more), and the disk recording from there on."""
        state = crash_state(self.ops, point, variant, seed)
        shutil.rmtree(self.root)
        self.root.mkdir()
        materialize(state, self.root)
        return SimDisk(self.root, adopt=True)
