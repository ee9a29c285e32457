"""A stream's storage: one segmented log, read by offset or timestamp, never consumed.

Responsibilities:
- ``LogStream``: append (every record persistent: a stream keeps what it is given), read a
  record by offset, find the first offset at or after a timestamp, the first and next offsets;
- retention per whole segment, Kafka's way (``x-max-length-bytes``, ``x-max-age``), never the
  active segment; removed segments are deleted at the next flush;
- the flush protocol the log backend's flushes drive (``begin_flush`` / ``close`` / ``abandon``),
  like ``LogQueueStore``'s, without ack state: readers keep their own positions;
- stored positions, made durable by the next flush: ``offsets`` by consumer tag (server-side
  offset tracking) and ``group_offsets`` by consumer group (the group's committed offset on
  this stream).

Recovery after a crash rescans the segments written since the last flush (``recovery_point`` in
``stream.cbor``), as queue logs do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import cbor2

from ...fsutil import atomic_write
from ...model import Message
from .format import FLAG_PERSISTENT, Record
from .log import Log
from .segment import Segment

STATE_FILE = "stream.cbor"


class LogStream:
    def __init__(self, directory: Path, log: Log) -> None:
        self.directory = directory
        self.log = log
        self._synced_upto = 0
        self._obsolete: list[Segment] = []
        # Server-side offset tracking: the next offset each tracked consumer reads, by tag.
        self.offsets: dict[str, int] = {}
        # Consumer groups: the committed offset (the next one to read) of each group, by name.
        self.group_offsets: dict[str, int] = {}
        self._offsets_dirty = False
        self._lock = threading.Lock()
        self.abandoned = False

    def open(self) -> None:
        try:
            state = cbor2.loads((self.directory / STATE_FILE).read_bytes())
        except (OSError, ValueError, cbor2.CBORDecodeError):
            state = {}
        if not isinstance(state, dict):
            state = {}
        recovery_point = int(state.get("recovery_point", 0))
        self.log.open(recovery_point=recovery_point)
        self._synced_upto = recovery_point
        self.offsets = _positions(state.get("offsets"))
        self.group_offsets = _positions(state.get("groups"))

    # -- reading and writing -----------------------------------------------------------------

    def append(self, message: Message) -> int:
        return self.log.append(message, FLAG_PERSISTENT)

    def read(self, offset: int) -> Record | None:
        """The record at ``offset``; None below the first offset, at the end, or for a record
        that is damaged (logged by the log)."""
        if offset < self.first_offset:
            return None
        return self.log.read(offset)

    @property
    def first_offset(self) -> int:
        return self.log.start_offset

    @property
    def next_offset(self) -> int:
        return self.log.next_offset

    def store_offset(self, consumer_tag: str, offset: int) -> None:
        """Remember where a tracked consumer goes on (durable after the next flush)."""
        if self.offsets.get(consumer_tag) != offset:
            self.offsets[consumer_tag] = offset
            self._offsets_dirty = True

    def commit_group_offset(self, group: str, offset: int) -> None:
        """Remember a consumer group's committed offset (durable after the next flush)."""
        if self.group_offsets.get(group) != offset:
            self.group_offsets[group] = offset
            self._offsets_dirty = True

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        return max(self.log.offset_for_timestamp(timestamp_ms), self.first_offset)

    def apply_retention(self, *, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Detach whole segments past retention (deleted at the next flush); return how many."""
        removed = self.log.segments_past_retention(
            max_bytes=max_bytes, max_age_ms=max_age_ms, now_ms=now_ms
        )
        self._obsolete.extend(removed)
        return len(removed)

    # -- the flush protocol ------------------------------------------------------------------

    @property
    def needs_flush(self) -> bool:
        return self.log.next_offset > self._synced_upto or bool(
            self._obsolete or self._offsets_dirty
        )

    def begin_flush(self, *, fsync: bool = True) -> Callable[[], None] | None:
        """Write out buffered records; return the blocking work: fsync (unless ``fsync`` is
        false), record the recovery point, delete segments past retention."""
        if fsync:
            sync = self.log.sync_work()
        else:
            self.log.write_out()
            sync = None
        if sync is None and not self._obsolete and not self._offsets_dirty:
            return None
        synced_upto = self.log.next_offset if sync is not None else self._synced_upto
        obsolete, self._obsolete = self._obsolete, []
        state = {
            "recovery_point": synced_upto,
            "offsets": dict(self.offsets),
            "groups": dict(self.group_offsets),
        }
        offsets_dirty, self._offsets_dirty = self._offsets_dirty, False

        def work() -> None:
            try:
                if sync is not None:
                    sync()
                with self._lock:
                    if self.abandoned:
                        return
                    atomic_write(
                        self.directory / STATE_FILE,
                        cbor2.dumps(state),
                        fsync=sync is not None or offsets_dirty,
                    )
                    for segment in obsolete:
                        segment.delete()
            except OSError:
                self._obsolete[:0] = obsolete
                self._offsets_dirty = self._offsets_dirty or offsets_dirty
                raise
            self._synced_upto = max(self._synced_upto, synced_upto)

        return work

    def close(self) -> None:
        work = self.begin_flush()
        if work is not None:
            work()
        for segment in self.log.segments:
            segment.sync()
        self.log.close(clean=True)

    def abandon(self, move_to: Path) -> None:
        with self._lock:
            self.abandoned = True
            self.directory.rename(move_to)

    def close_abandoned(self) -> None:
        self.log.close(clean=False)


def _positions(value: object) -> dict[str, int]:
    """Stored positions by name, from ``stream.cbor`` (anything else: none)."""
    if not isinstance(value, dict):
        return {}
    return {str(name): int(offset) for name, offset in value.items()}
