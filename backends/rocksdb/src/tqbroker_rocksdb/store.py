"""One queue of the RocksDB backend: its compact in-memory index over the records in RocksDB.

Responsibilities:
- the ready ids (requeued heap, recovered flagged and fresh arrays, the dense range pushed in
  this run), the unacked ids with their body sizes, and ``ready_bytes``;
- which ids are transient (runs of ids), and the bodies not yet written (``_pending``);
- recording pushes, acks and purges as writes of the current batch.

See "RocksDB backend" in docs/storage-format.md.
"""

from __future__ import annotations

import heapq
import logging
from array import array
from bisect import bisect_right
from collections.abc import Callable

from tqbroker.backends import FLUSH_FIRST, FlushFirst, Message, Popped

from .codec import (
    decode_record,
    message_key,
    queue_prefix,
    reservation_key,
    transient_key,
    transient_prefix,
)
from .reservations import Reservation, ReservationPlanner
from .writer import Writer

log = logging.getLogger(__name__)


class RocksDBQueueStore:
    """The messages of one queue; see "RocksDB backend" in docs/storage-format.md."""

    def __init__(
        self,
        qid: int,
        *,
        writer: Writer,
        planner: ReservationPlanner,
        reap: Callable[[], None],
        id_limit: int,
        next_id: int = 1,
        reserved: int = 0,
        flagged: array[int] | None = None,
        fresh: array[int] | None = None,
        ready_bytes: int = 0,
    ) -> None:
        self.qid = qid
        self._writer = writer
        self._planner = planner
        self._reap = reap  # takes in completed flushes (the backend's)
        self._prefix = queue_prefix(qid)
        self._transient_prefix = transient_prefix(qid)
        self._next_id = next_id
        # Ready ids, oldest first: requeued and recovered-flagged (redelivered), then recovered
        # fresh, then the ones pushed in this run, [dense_cursor, next_id).
        self._requeued: list[int] = []  # heap
        self._flagged = flagged if flagged is not None else array("Q")
        self._flagged_pos = 0
        self._fresh = fresh if fresh is not None else array("Q")
        self._fresh_pos = 0
        self._dense_cursor = next_id
        self._unacked: dict[int, int] = {}  # id: body size
        self._ready_bytes = ready_bytes
        # Which ids are transient (their records live under ``t`` keys): those pushed in this run
        # and not yet popped as runs ``[start, end)``, flattened, from ``_runs_pos`` on (fresh ids
        # are popped in order, so runs behind the cursor are dropped); those popped since, until
        # acked (unacked or requeued), in a set. Recovered messages are all persistent.
        self._runs = array("Q")
        self._runs_pos = 0
        self._transient_out: set[int] = set()
        # Bodies held in memory: messages whose write has not completed yet, whatever their
        # persistence (a store of a deleted queue keeps all its messages here).
        self._pending: dict[int, Message] = {}
        self.reservation = Reservation(reservation_key(self._prefix), reserved, planner.minimum)
        self._id_limit = id_limit
        self._deleted = False

    # -- QueueStore ----------------------------------------------------------------------------

    def push(self, message: Message, persistent: bool = False) -> int:
        message_id = self._next_id
        if message_id >= self._id_limit:
            raise RuntimeError("this run used up its 2**40 message ids: restart the broker")
        self._next_id += 1
        self._planner.pushed.add(self)
        self._pending[message_id] = message
        self._ready_bytes += len(message.body)
        if self._deleted:
            self._add_transient(message_id)  # never written: like a transient message
        elif persistent:
            self._writer.ops[message_key(self._prefix, message_id)] = message
        else:
            self._add_transient(message_id)
            self._writer.ops[transient_key(self._transient_prefix, message_id)] = message
        return message_id

    def peek(self) -> Popped | FlushFirst | None:
        self._reap()
        head = self._head()
        return head if head is None or head is FLUSH_FIRST else head[:3]

    def pop(self) -> Popped | FlushFirst | None:
        self._reap()
        self._planner.active.add(self)  # someone consumes: plan a reservation at the next flush
        head = self._head()
        if head is None or head is FLUSH_FIRST:
            return head
        message_id, message, flagged, transient = head
        if flagged:
            self._take_flagged(message_id)
        else:
            self._take_fresh()
            if transient:
                self._transient_out.add(message_id)
            else:
                self.reservation.popped += 1
        size = len(message.body)
        self._ready_bytes -= size
        self._unacked[message_id] = size
        return message_id, message, flagged

    def _head(self) -> tuple[int, Message, bool, bool] | FlushFirst | None:
        """The next message ``pop`` takes, as ``(id, message, flagged, transient)``: flagged
        ones (requeued, or recovered below the reservation) are redelivered; ``transient`` is
        known for fresh ones only. None when nothing is ready; ``FLUSH_FIRST`` when the
        reservation must be extended first (the next flush then extends it). Messages whose
        record has vanished are skipped for good."""
        while True:
            message_id = self._flagged_head()
            if message_id is not None:
                message = self._load(message_id, message_id in self._transient_out)
                if message is not None:
                    return message_id, message, True, False
                self._take_flagged(message_id)
                self._transient_out.discard(message_id)
                continue
            message_id = self._fresh_head()
            if message_id is None:
                # Nothing is ready: no bytes either (even if a vanished record's were unknown).
                self._ready_bytes = 0
                return None
            # Transient messages never survive a restart: popping them needs no reservation.
            transient = self._is_fresh_transient(message_id)
            if not transient and message_id >= self.reservation.reserved:
                self._planner.wanting.add(self)
                return FLUSH_FIRST
            message = self._load(message_id, transient)
            if message is not None:
                return message_id, message, False, transient
            self._take_fresh()

    def ack(self, message_id: int) -> None:
        if self._unacked.pop(message_id, None) is not None:
            self._forget(message_id, self._settle_transient(message_id))

    def requeue(self, message_id: int) -> None:
        size = self._unacked.pop(message_id, None)
        if size is not None:
            heapq.heappush(self._requeued, message_id)
            self._ready_bytes += size

    def purge(self) -> int:
        count = self.ready_count
        self._ready_bytes = 0
        if not count:
            return 0
        for message_id in self._requeued:
            self._forget(message_id, self._settle_transient(message_id))
        self._requeued.clear()
        for message_id in self._flagged[self._flagged_pos :]:
            self._forget(message_id, False)
        self._flagged, self._flagged_pos = array("Q"), 0
        head = self._fresh_head()
        if head is not None:
            # Every id from the fresh head on is ready (fresh ids are popped in order): cancel
            # the unwritten puts, and range-delete whatever was written (of either kind).
            fresh_count = len(self._fresh) - self._fresh_pos + self._next_id - self._dense_cursor
            runs = self._runs
            transient_count = sum(
                runs[i + 1] - max(runs[i], head) for i in range(self._runs_pos, len(runs), 2)
            )
            cancelled = [0, 0]  # puts never sealed, so never written: persistent, transient
            ops = self._writer.ops
            for message_id in [i for i in self._pending if i >= head]:
                del self._pending[message_id]
                transient = self._is_fresh_transient(message_id)
                key = self._key(message_id, transient)
                if isinstance(ops.get(key), Message):
                    del ops[key]
                    cancelled[transient] += 1
            if not self._deleted:
                ranges = self._writer.ranges
                if fresh_count - transient_count > cancelled[False]:
                    ranges.append(
                        (message_key(self._prefix, head), message_key(self._prefix, self._next_id))
                    )
                if transient_count > cancelled[True]:
                    ranges.append(
                        (
                            transient_key(self._transient_prefix, head),
                            transient_key(self._transient_prefix, self._next_id),
                        )
                    )
            self._fresh, self._fresh_pos = array("Q"), 0
            self._dense_cursor = self._next_id
            self._runs, self._runs_pos = array("Q"), 0
        return count

    @property
    def ready_count(self) -> int:
        return (
            len(self._requeued)
            + len(self._flagged)
            - self._flagged_pos
            + len(self._fresh)
            - self._fresh_pos
            + self._next_id
            - self._dense_cursor
        )

    @property
    def ready_bytes(self) -> int:
        return self._ready_bytes

    @property
    def unacked_count(self) -> int:
        return len(self._unacked)

    @property
    def wants_flush(self) -> bool:
        """Less than half the reservation is left (counting one being written) while fresh
        messages wait: a flush now extends it before deliveries have to pause."""
        head = self._fresh_head()
        reservation = self.reservation
        return head is not None and reservation.target - head < reservation.window // 2

    # -- the backend's side -------------------------------------------------------------------

    def cursor(self) -> int:
        """The oldest fresh (never popped) id; every fresh id below it has been popped."""
        head = self._fresh_head()
        return self._next_id if head is None else head

    def release_body(self, message_id: int) -> None:
        """The message's record was written: read it from RocksDB from now on."""
        self._pending.pop(message_id, None)

    def delete(self) -> None:
        """The queue was deleted: cancel its unwritten puts and keep whatever is pushed from now
        on in memory only (its records are range-deleted by the backend)."""
        self._deleted = True
        ops = self._writer.ops
        for message_id in self._pending:  # unwritten puts: cancel them
            for key in (
                message_key(self._prefix, message_id),
                transient_key(self._transient_prefix, message_id),
            ):
                if isinstance(ops.get(key), Message):
                    del ops[key]
        self._pending.clear()
        self._runs, self._runs_pos = array("Q"), 0
        self._transient_out.clear()

    # -- internals -----------------------------------------------------------------------------

    def _flagged_head(self) -> int | None:
        requeued = self._requeued[0] if self._requeued else None
        if self._flagged_pos < len(self._flagged):
            recovered = self._flagged[self._flagged_pos]
            return recovered if requeued is None or recovered < requeued else requeued
        return requeued

    def _take_flagged(self, message_id: int) -> None:
        """Take ``message_id``, the one ``_flagged_head`` returned."""
        if self._requeued and self._requeued[0] == message_id:
            heapq.heappop(self._requeued)
            return
        self._flagged_pos += 1
        if self._flagged_pos == len(self._flagged):
            self._flagged, self._flagged_pos = array("Q"), 0

    def _fresh_head(self) -> int | None:
        if self._fresh_pos < len(self._fresh):
            return self._fresh[self._fresh_pos]
        if self._dense_cursor < self._next_id:
            return self._dense_cursor
        return None

    def _take_fresh(self) -> None:
        if self._fresh_pos < len(self._fresh):
            self._fresh_pos += 1
            if self._fresh_pos == len(self._fresh):
                self._fresh, self._fresh_pos = array("Q"), 0
            return
        self._dense_cursor += 1
        # Forget the runs now wholly behind the cursor.
        runs, pos = self._runs, self._runs_pos
        if pos < len(runs) and runs[pos + 1] <= self._dense_cursor:
            pos += 2
            if pos == len(runs):
                self._runs, pos = array("Q"), 0
            elif pos >= 1024 and 2 * pos >= len(runs):
                del runs[:pos]  # amortised: each run is moved at most once on average
                pos = 0
            self._runs_pos = pos

    def _add_transient(self, message_id: int) -> None:
        """Record a transient message pushed in this run (ids are pushed in increasing order)."""
        runs = self._runs
        if len(runs) > self._runs_pos and runs[-1] == message_id:
            runs[-1] = message_id + 1
        else:
            runs.append(message_id)
            runs.append(message_id + 1)

    def _is_fresh_transient(self, message_id: int) -> bool:
        """Whether a ready fresh (never popped) message is transient."""
        # Runs are disjoint and increasing: an id is in one iff an odd number of bounds are at
        # or below it (``_runs_pos`` is even).
        return bisect_right(self._runs, message_id, self._runs_pos) % 2 == 1

    def _settle_transient(self, message_id: int) -> bool:
        """Whether a delivered message (leaving the unacked set or the requeued heap for good)
        is transient; it is forgotten."""
        if message_id in self._transient_out:
            self._transient_out.remove(message_id)
            return True
        return False

    def _key(self, message_id: int, transient: bool) -> bytes:
        if transient:
            return transient_key(self._transient_prefix, message_id)
        return message_key(self._prefix, message_id)

    def _load(self, message_id: int, transient: bool) -> Message | None:
        message = self._pending.get(message_id)
        if message is not None:
            return message
        record = self._writer.read(self._key(message_id, transient))
        if record is None:
            log.error("queue %d: message %d has no record; skipping it", self.qid, message_id)
            return None
        return decode_record(record)

    def _forget(self, message_id: int, transient: bool) -> None:
        """Drop a message for good (acked or purged)."""
        self._pending.pop(message_id, None)
        if self._deleted:
            return
        ops = self._writer.ops
        key = self._key(message_id, transient)
        if isinstance(ops.get(key), Message):
            del ops[key]  # its put was never sealed: it never reaches the disk
        else:
            ops[key] = None
