"""The flush of a store on a log (``LogQueueStore``, ``LogStream``), written once.

A flush begins on the Trio thread and returns the blocking work the flusher runs in a worker
thread. ``LogFlush`` is one store's side of it:
- the sync or the write-out (``sync_work``): with ``fsync`` the log's buffered records are
  written out and its fsync work taken (``Log.sync_work``); without, they are only written out
  and stay marked for a later fsync;
- the choice (``work``): a flush that only appended leaves the store's checkpoint alone (one
  fdatasync per group commit) and its work is the fsync, then the synced mark moved; the
  checkpoint is written when the store's own state is due, segments wait to be deleted
  (``obsolete``) or closed (``retired``), or the recovery point would pass a sealed segment
  (``sealed_past``: sparing that segment's rescan after a crash);
- a full flush's work: the retired segments closed (the flush before, the last that could use
  them, is over), the fsync, then under ``lock`` the store's ``Checkpoint`` written, the
  directory fsync'd if segments were retired (their renames) and the obsolete segments deleted.
  ``lock`` is what ``abandon`` takes: a store deleted meanwhile writes nothing more. An
  ``OSError`` puts back what the flush took (the segments, and the store's own state through
  ``Checkpoint.failed``), so the backend keeps asking for a flush that does it again;
- truncation (streams): a flush that began before one must not move the synced mark, nor write
  its recovery point, after it (``truncated``).

``ChangeFlag`` is a store's "the next flush has work" attribute, which tells the backend (the
log backend flushes only the stores that said so).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .log import Log
from .segment import Segment


class ChangeFlag:
    """A store's boolean "the next flush has work" attribute (a descriptor): setting it True
    also tells the backend, through the store's ``log.changed``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = "_flag" + name

    def __get__(self, store: object, owner: type | None = None) -> bool:
        return bool(getattr(store, self._name, False))

    def __set__(self, store: Any, dirty: bool) -> None:
        setattr(store, self._name, dirty)
        if dirty:
            store.log.changed()


class Checkpoint(NamedTuple):
    """What one full flush writes besides the records: the store's state as the flush began
    (taken on the Trio thread)."""

    # Write it (worker thread: after the fsync, under ``LogFlush.lock``, the store not
    # deleted). The argument: no truncation since the flush began (else its recovery point is
    # stale).
    write: Callable[[bool], None]
    # The flush failed: what the checkpoint took is due again.
    failed: Callable[[], None]


def _nothing(_synced_upto: int) -> None:
    pass


class LogFlush:
    """One store's flush state over its log, and the skeleton of its flushes."""

    def __init__(self, log: Log, *, on_synced: Callable[[int], None] = _nothing) -> None:
        self.log = log
        # Called (under ``lock``) when a flush that wrote no checkpoint made the records below
        # its argument durable.
        self._on_synced = on_synced
        self.synced_upto = 0  # offsets below are fsync'd: the recovery point a checkpoint takes
        self.recovery_written = 0  # the recovery point of the checkpoint on disk
        # Detached segments (settled, past retention): deleted by the next full flush.
        self.obsolete: list[Segment] = []
        # Segments replaced (compaction) or cut off (truncation): a flush in flight may still
        # sync them, so the next full flush closes them (and makes the renames durable).
        self.retired: list[Segment] = []
        self.lock = threading.Lock()  # a full flush's checkpoint and deletes; ``abandon``
        self.abandoned = False  # the store was deleted: write nothing more
        self.truncations = 0  # see ``truncated``

    def sync_work(self, fsync: bool) -> Callable[[], None] | None:
        """Write out the log's buffered records (may raise OSError) and, with ``fsync``, take
        its fsync work (None: nothing to sync)."""
        if fsync:
            return self.log.sync_work()
        self.log.write_out()
        return None

    def work(
        self,
        sync: Callable[[], None] | None,
        *,
        due: bool,
        checkpoint: Callable[[int], Checkpoint],
    ) -> Callable[[], None] | None:
        """The blocking work of a flush whose fsync work is ``sync`` (``sync_work``), or None
        when there is nothing to do. ``due``: the store's own state changed since its last
        checkpoint. ``checkpoint`` takes that state now, with the recovery point it records."""
        log = self.log
        truncations = self.truncations
        synced_upto = log.next_offset if sync is not None else self.synced_upto
        # A commit that only appended leaves the checkpoint alone until the recovery point
        # would pass a sealed segment: only then does it spare the rescan of that segment.
        sealed_past = sync is not None and log.segments[-1].base_offset > self.recovery_written
        if not (due or self.obsolete or self.retired or sealed_past):
            if sync is None:
                return None

            def sync_only() -> None:
                sync()
                with self.lock:
                    if self.truncations == truncations:
                        self.synced_upto = max(self.synced_upto, synced_upto)
                        self._on_synced(synced_upto)

            return sync_only
        taken = checkpoint(synced_upto)
        obsolete, self.obsolete = self.obsolete, []
        retired, self.retired = self.retired, []

        def work() -> None:
            for segment in retired:  # the previous flush, the last that could use them, is over
                segment.close()
            try:
                if sync is not None:
                    sync()
                with self.lock:
                    if self.abandoned:  # deleted meanwhile: its files are gone
                        return
                    taken.write(self.truncations == truncations)
                    if retired:
                        log.env.fsync_dir(log.directory)
                    for segment in obsolete:
                        segment.delete()
                    if obsolete:
                        log.segments_deleted()
            except OSError:
                # Nothing of this flush is durable: the next one does it again.
                self.obsolete[:0] = obsolete
                taken.failed()
                raise

        return work

    def truncated(self, end: int) -> None:
        """The log was cut back to ``end`` (under ``lock``): the synced mark and the recovery
        point on disk are at most there, and a flush that began before writes neither."""
        self.truncations += 1
        self.synced_upto = min(self.synced_upto, end)
        self.recovery_written = min(self.recovery_written, end)

    def abandon(self, move_to: Path) -> None:
        """The store is being deleted: from now on a flush in flight writes nothing more, and
        the log's directory moves to ``move_to`` (atomically with respect to those writes).
        ``OSError``: nothing changed, the store stays."""
        with self.lock:
            self.log.move(move_to)
            self.abandoned = True
