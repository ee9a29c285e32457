"""A classic queue on an append log: the ``QueueStore`` of the ``log`` backend.

Responsibilities:
- message ids are log offsets; every message (persistent or not) is appended to the log, transient
  ones flagged so that recovery skips them;
- the ack state, kept compactly: ``head`` (every offset below is settled) plus ranges of settled
  offsets above it, the delivery cursor, the requeued offsets and the unacked set (with their body
  sizes); bodies are never held in memory between delivery and ack (a requeued message is read
  again);
- ``ready_bytes``, kept up to date as messages come and go; at open it comes from the checkpoint
  of a clean stop, otherwise from reading the ready records (which also drops the transient
  messages of the crashed run); a damaged record, whose size is lost, makes it read them again;
- a checkpoint (``state.cbor``: head, settled ranges, the delivered reservation, the recovery
  point; at a clean stop also the exact delivery mark and ready bytes), written atomically during
  flushes;
- the delivered reservation: offsets below it may have been delivered, so after a crash they come
  back flagged redelivered; the queue never delivers past it until a flush has extended it (a
  new queue writes nothing at open: its first window is reserved by having no checkpoint, a
  recovery then flagging every record redelivered; the flush after its first push writes one);
- segments whose every record is settled are deleted.

Over 400 lines as one job: the ack state and the checkpoint that records it are changed
together under one invariant (nothing settled comes back, nothing unsettled is lost).
"""

from __future__ import annotations

import errno
import heapq
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import cbor2

from ...model import Message
from ..base import FLUSH_FIRST, FlushFirst, Popped
from .flush import ChangeFlag, Checkpoint, LogFlush
from .format import FLAG_PERSISTENT, Record
from .log import RESOURCE_ERRNOS, Log
from .ranges import RangeSet

log = logging.getLogger(__name__)

STATE_FILE = "state.cbor"
RESERVE_WINDOW = 8192
HOT_BACKLOG = 1024  # messages behind the delivery cursor that are still worth caching


class LogQueueStore:
    _state_dirty = ChangeFlag()  # the checkpoint is out of date

    def __init__(self, directory: Path, log: Log) -> None:
        self.directory = directory
        self.log = log
        self.env = log.env
        # The synced mark, the recovery point on disk, the segments to delete, the lock a
        # delete takes: ``flush.py``.
        self.flush = LogFlush(log)
        self.head = 0
        self.settled = RangeSet()
        self.transient = RangeSet()  # offsets of transient messages (dropped at restart)
        self.cursor = 0
        self._requeued: list[tuple[int, int]] = []  # heap of (offset, body size)
        self._unacked: dict[int, int] = {}  # offset: body size
        self._ready = 0
        self._ready_bytes = 0
        self._fresh_transient_bytes = 0  # of the transient messages never delivered
        self._recount_due = False  # a damaged record's size was lost: count the bytes again
        self.redelivered_below = 0  # offsets below this were (maybe) delivered in an earlier run
        self.delivered_reserved = 0  # durable: we may deliver offsets below this
        self._reserve_target = 0
        self._state_dirty = False
        # A new queue has no checkpoint on disk yet: its first push asks for one.
        self._unwritten = False
        self._recovered_end = 0  # offsets below this predate this run (transient ones are stale)
        self._state_seq = 0  # snapshots taken
        self._state_written = 0  # the newest snapshot on disk

    # -- recovery ----------------------------------------------------------------------------

    def open(self) -> None:
        state, state_lost = self._read_state()
        recovery_point = int(state.get("recovery_point", 0))
        clean = self.log.open(recovery_point=recovery_point) and not state_lost
        start, end = self.log.start_offset, self.log.next_offset
        settled = [(int(a), int(b)) for a, b in state.get("settled", [])]
        transient = [(int(a), int(b)) for a, b in state.get("transient", [])]
        # The checkpoint may know offsets the log lost (a power loss took an unsynced tail but
        # kept the checkpoint): never hand those offsets out again, continue after them.
        known_end = max([int(state.get("head", 0))] + [b for _a, b in settled + transient])
        if known_end > end:
            log.warning(
                "%s: the log ends at %d but its checkpoint knows offsets up to %d; continuing "
                "at %d",
                self.directory,
                end,
                known_end,
                known_end,
            )
            self.log.roll_to(known_end)
            end = known_end
        self.head = max(int(state.get("head", 0)), start)
        self.settled = RangeSet(settled)
        # Transient messages of the previous run are gone: settle them now so counts are exact
        # (those written after the last checkpoint of a crashed run are settled by _recount).
        for a, b in transient:
            self.settled.add(a, min(b, end))
        # So are the offsets that no segment holds: records lost with the buffers of segments
        # rolled just before a crash, or offsets only the checkpoint knew (see above).
        for a, b in self.log.gaps():
            self.settled.add(a, b)
        self.settled.drop_below(self.head)
        self.head = self.settled.pop_prefix(self.head)
        delivered = int(state.get("delivered", 0))
        if clean:
            delivered = int(state.get("delivered_exact", delivered))
        if state_lost or not (state or self.log.created):
            # Nothing is known (a new queue's records, its first checkpoint lost to a power
            # cut: see ``_unwritten``): flag every surviving message redelivered.
            delivered = end
        self.delivered_reserved = self._reserve_target = delivered
        # The reservation may reach past the recovered end: offsets from the end on are new
        # messages (never delivered), not redeliveries.
        self.redelivered_below = min(delivered, end)
        self.cursor = self.head
        self._recovered_end = end
        flush = self.flush
        flush.synced_upto = recovery_point if not clean else end
        if self.log.created and not state and not state_lost:
            # A new queue: nothing is written now (a declare creates nothing on disk), and its
            # first window is taken as reserved: until a checkpoint is on disk a recovery
            # takes every record found for delivered (see above). Its first message asks the
            # next flush for that checkpoint. A power cut before leaves an empty directory or
            # none: recovery takes either for a new queue.
            self.delivered_reserved = self._reserve_target = RESERVE_WINDOW
            self._unwritten = True
            flush.recovery_written = recovery_point
        else:
            self._reserve_window(recovery_point)
        self._ready = (end - self.head) - sum(
            min(b, end) - max(a, self.head) for a, b in self.settled.as_list() if a < end
        )
        recorded = state.get("ready_bytes") if clean else None
        if recorded is not None:  # exact: written by the clean stop
            self._ready_bytes = int(recorded)
        else:
            self._recount()

    def _reserve_window(self, recovery_point: int) -> None:
        """Reserve a first delivery window now, durably, so delivery starts without a flush."""
        flush = self.flush
        self._reserve_target = max(self.cursor, self.delivered_reserved) + RESERVE_WINDOW
        try:
            self._write_state(self._state(self._reserve_target), fsync=True)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # A full disk: open anyway (the broker starts, with its disk alarm set); the first
            # deliveries wait for a flush that can write their reservation.
            log.warning("%s: cannot reserve a delivery window yet: %s", self.directory, exc)
            flush.recovery_written = recovery_point
        else:
            flush.recovery_written = flush.synced_upto
            self.delivered_reserved = self._reserve_target

    def _read_state(self) -> tuple[dict[str, Any], bool]:
        """The checkpoint, and whether one existed but could not be read (then the queue
        restarts from what the log holds, every message flagged redelivered)."""
        path = self.directory / STATE_FILE
        try:
            state = cbor2.loads(path.read_bytes())
        except FileNotFoundError:
            return {}, False
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:
                raise  # out of descriptors or memory: the open fails, the checkpoint is fine
            log.warning("%s: unreadable checkpoint (%s); recovering from the log", path, exc)
            return {}, True
        except (cbor2.CBORDecodeError, ValueError) as exc:
            log.warning("%s: unreadable checkpoint (%s); recovering from the log", path, exc)
            return {}, True
        if not isinstance(state, dict):
            log.warning("%s: unreadable checkpoint; recovering from the log", path)
            return {}, True
        return state, False

    # -- QueueStore --------------------------------------------------------------------------

    def push(self, message: Message, persistent: bool = False) -> int:
        # Cache the message only while delivery keeps up with the log end: a message at the
        # end of a long backlog will not be read soon, and caching it would only cost.
        hot = self.log.next_offset - self.cursor < HOT_BACKLOG
        offset = self.log.append(message, FLAG_PERSISTENT if persistent else 0, hot=hot)
        if self._unwritten:  # a new queue's first message: the flush that makes it durable
            self._unwritten = False  # writes its first checkpoint too
            self._state_dirty = True
        size = len(message.body)
        if not persistent:
            self.transient.add(offset, offset + 1)
            self._fresh_transient_bytes += size
        self._ready += 1
        self._ready_bytes += size
        return offset

    def peek(self) -> Popped | FlushFirst | None:
        head = self._head()
        if head is None or head is FLUSH_FIRST:
            return head
        offset, record, requeued = head
        return offset, record.message, requeued or offset < self.redelivered_below

    def pop(self) -> Popped | FlushFirst | None:
        head = self._head()
        if head is None or head is FLUSH_FIRST:
            return head
        offset, record, requeued = head
        size = len(record.message.body)
        if requeued:
            heapq.heappop(self._requeued)
        else:
            self.cursor += 1
            if not record.persistent:
                self._fresh_transient_bytes -= size
        self._ready -= 1
        self._ready_bytes -= size
        self._unacked[offset] = size
        return offset, record.message, requeued or offset < self.redelivered_below

    def _head(self) -> tuple[int, Record, bool] | FlushFirst | None:
        """The next message ``pop`` takes, as ``(offset, record, requeued)``; None when nothing
        is ready; ``FLUSH_FIRST`` when the delivery reservation must be extended first (then
        asked for). Damaged
        records met on the way (logged by the log) are settled."""
        while self._requeued:
            offset, size = self._requeued[0]
            record = self.log.reader.read(offset)
            if record is not None:
                return offset, record, True
            heapq.heappop(self._requeued)
            self._drop(offset, size)
        end = self.log.next_offset
        while self.cursor < end:
            if self.cursor < self.head:
                self.cursor = self.head  # everything below head is settled
                continue
            offset = self.cursor
            if offset in self.settled:
                self.cursor += 1
                continue
            if offset >= self.delivered_reserved:
                self._request_reservation(offset)
                return FLUSH_FIRST
            if offset >= self.delivered_reserved - RESERVE_WINDOW // 2:
                self._request_reservation(offset)
            record = self.log.reader.read(offset)
            if record is not None:
                return offset, record, False
            self.cursor += 1
            self._drop(offset, None)
        return None

    def _drop(self, offset: int, size: int | None) -> None:
        """Settle a ready message whose record is damaged; ``size`` None: not known."""
        self._settle(offset)
        self._ready -= 1
        if size is None:
            self._recount_due = True
        else:
            self._ready_bytes -= size

    def _recount(self) -> None:
        """Count the body bytes of the ready messages by reading their records (damaged ones
        count for nothing). Transient messages of an earlier run met on the way are gone: they
        are settled."""
        self._recount_due = False
        fresh = transient = 0
        for record in self.log.reader.records(max(self.cursor, self.head)):
            offset = record.offset
            if offset < self.head or offset in self.settled:
                continue
            size = len(record.message.body)
            if record.persistent:
                fresh += size
            elif offset < self._recovered_end:
                self._settle(offset)
                self._ready -= 1
            else:
                fresh += size
                transient += size
        self._ready_bytes = fresh + sum(size for _offset, size in self._requeued)
        self._fresh_transient_bytes = transient

    def _request_reservation(self, offset: int) -> None:
        target = max(offset, self.delivered_reserved) + RESERVE_WINDOW
        if self._reserve_target < target:
            self._reserve_target = target
            self._state_dirty = True

    def ack(self, message_id: int) -> None:
        if self._unacked.pop(message_id, None) is not None:
            self._settle(message_id)

    def requeue(self, message_id: int) -> None:
        size = self._unacked.pop(message_id, None)
        if size is not None:
            heapq.heappush(self._requeued, (message_id, size))
            self._ready += 1
            self._ready_bytes += size

    def purge(self) -> int:
        count = self._ready
        for offset, _size in self._requeued:
            self._settle(offset)
        self._requeued.clear()
        end = self.log.next_offset
        self.settled.add(self.cursor, end)
        self.cursor = end
        self._advance_head()
        self._ready = self._ready_bytes = self._fresh_transient_bytes = 0
        self._recount_due = False
        self._state_dirty = True
        return count

    @property
    def ready_count(self) -> int:
        return self._ready

    @property
    def ready_bytes(self) -> int:
        if self._recount_due:
            self._recount()
        return self._ready_bytes

    def _surviving_bytes(self) -> int:
        """The body bytes ready after a restart: those of the persistent messages that are
        ready or unacked now."""
        transient = self.transient
        requeued = sum(size for offset, size in self._requeued if offset in transient)
        unacked = sum(size for offset, size in self._unacked.items() if offset not in transient)
        return self.ready_bytes - self._fresh_transient_bytes - requeued + unacked

    @property
    def unacked_count(self) -> int:
        return len(self._unacked)

    def _settle(self, offset: int) -> None:
        self.settled.add(offset, offset + 1)
        self._advance_head()
        self._state_dirty = True

    def _advance_head(self) -> None:
        self.head = self.settled.pop_prefix(self.head)

    # -- durability --------------------------------------------------------------------------

    @property
    def needs_flush(self) -> bool:
        return self._state_dirty or self.log.needs_sync

    def begin_flush(self, *, fsync: bool = True) -> Callable[[], None] | None:
        """Write out buffered records (may raise OSError) and return the blocking work
        (``LogFlush.work``): fsync the log (unless ``fsync`` is false: the records then stay
        marked for a later fsync), then write the checkpoint atomically, then delete fully
        settled segments."""
        flush = self.flush
        if self._state_dirty:
            self.log.materialize()  # here (may raise OSError), not in the flush's thread
        sync = flush.sync_work(fsync)
        flush.obsolete.extend(self.log.delete_segments_below(self.head))
        return flush.work(sync, due=self._state_dirty, checkpoint=partial(self._checkpoint, fsync))

    def _checkpoint(self, fsync: bool, synced_upto: int) -> Checkpoint:
        """A full flush's checkpoint, taken now: the ack state, the delivery reservation asked
        for, the recovery point ``synced_upto``. A queue's log is never truncated: always
        current."""
        self._state_dirty = False
        target = self._reserve_target
        state = self._state(target, recovery_point=synced_upto)
        flush = self.flush

        def write(_current: bool) -> None:
            flush.synced_upto = max(flush.synced_upto, synced_upto)
            # A wider delivery window is only valid once it is on disk, whatever the policy.
            self._put_state(state, fsync=fsync or target > self.delivered_reserved)
            flush.recovery_written = max(flush.recovery_written, synced_upto)
            # Publish the reservation only once it is on disk.
            self.delivered_reserved = max(self.delivered_reserved, target)

        def failed() -> None:
            # The checkpoint must be written again: the backend keeps asking for a flush.
            self._state_dirty = True

        return Checkpoint(write, failed)

    def _state(self, delivered: int, *, recovery_point: int | None = None) -> dict[str, Any]:
        self._state_seq += 1
        self.transient.drop_below(self.head)
        return {
            "seq": self._state_seq,
            "head": self.head,
            "settled": self.settled.as_list(),
            "transient": self.transient.as_list(),
            "delivered": delivered,
            # Segments that end before this were fsync'd: not rescanned after a crash.
            "recovery_point": self.flush.synced_upto if recovery_point is None else recovery_point,
        }

    @property
    def wants_flush(self) -> bool:
        return self._reserve_target > self.delivered_reserved

    def _write_state(self, state: dict[str, Any], *, fsync: bool) -> None:
        """Replace the checkpoint atomically (open and close; a flush writes it under the
        flush lock already). The open-time write (Trio thread) and a flush (worker thread) may
        meet, and a deleted queue must not be written: the lock, the snapshot number and the
        ``abandoned`` flag see to it."""
        with self.flush.lock:
            if not self.flush.abandoned:
                self._put_state(state, fsync=fsync)

    def _put_state(self, state: dict[str, Any], *, fsync: bool) -> None:
        """Replace the checkpoint atomically, unless a later snapshot is on disk already
        (under the flush lock)."""
        if state["seq"] <= self._state_written:
            return
        self.log.materialize()
        self.env.atomic_write(self.directory / STATE_FILE, cbor2.dumps(state), fsync=fsync)
        self._state_written = state["seq"]

    def close(self) -> None:
        """Clean shutdown: write out, fsync, exact checkpoint, clean marker."""
        self.log.write_out()
        work = self.begin_flush()
        if work is not None:
            work()
        if self.log.absent:  # nothing was ever written: it opens as a new queue again
            self.log.close(clean=False)
            return
        for segment in self.log.segments:
            segment.sync()
        self.flush.synced_upto = self.log.next_offset
        ready_bytes = self._surviving_bytes()
        state = self._state(self.delivered_reserved)
        state["delivered_exact"] = max(self.cursor, self.redelivered_below)
        state["ready_bytes"] = ready_bytes
        self._write_state(state, fsync=True)
        self.log.close(clean=True)

    def abandon(self, move_to: Path) -> None:
        """The queue is being deleted (``LogFlush.abandon``). The files stay open until
        ``close_abandoned`` (after any flush in flight has finished)."""
        self.flush.abandon(move_to)

    def close_abandoned(self) -> None:
        self.log.close(clean=False)
