"""The RocksDB backend: every durable queue of a broker in one RocksDB database.

The database lives in ``<data_dir>/rocksdb/``; ``codec.py`` has the key layout and the record
encoding. Nothing else in ``data_dir`` is touched.

Writes. Nothing is written to RocksDB on the Trio thread. ``push``, ``ack``, ``purge`` and
``delete_queue`` record their effect in the *current batch*, a dict from key to a ``Message`` (a
put, encoded later), ``bytes`` (a put) or ``None`` (a delete), plus a list of range deletes. A put
and a later delete of the same message in one batch cancel out, so a message acked (or purged)
before the flush that would have written it never reaches the disk. ``begin_flush`` *seals* the
current batch (appends it to a list of sealed batches) and returns a callable that, in the
flusher's worker thread, writes every batch sealed so far that is not yet written, in seal order,
as one RocksDB ``WriteBatch``, then fsyncs the write-ahead log. Not as one ``sync=True`` write:
rocksdict holds the GIL for the whole of a ``write`` call, fsync included, which would stall the
Trio thread for every fsync; so the batch is written unsynced (the GIL is held for a copy into the
memtable and the page cache, about a millisecond per MiB) and made durable by ``flush_wal(True)``
(RocksDB's ``SyncWAL``, which rocksdict runs without the GIL); RocksDB documents that pair as
durable as a synced write. Batches stay sealed until a write containing them succeeds, so a failed
write is retried whole by the next flush (rocksdict consumes a ``WriteBatch`` even when writing it
fails, which is why batches are kept as Python data and materialised in the worker). Every
operation is a blind put or delete, so writing a batch again after a write that failed yet reached
the disk is harmless. After a write error RocksDB refuses further writes until it is reopened; the
next flush reopens it first.

Transient messages are written like the others, in the same batches, so that their bodies leave
memory too, but under keys of their own (``t``, see ``codec.py``): ``open`` range-deletes them all
(in its synced first write, before any id of the new run is handed out), so they are gone after
any restart, clean or not. They never cost an fsync of their own: a write holding nothing but
transient puts and deletes skips ``flush_wal`` (the next synced write covers it anyway, the log
being sequential). A failed write of them makes the backend unhealthy like any other.

Reads. A queue keeps only a compact index in memory: ids of the ready messages pushed in this run
are the range ``[dense cursor, next id)``, and which of them are transient a list of runs (16 bytes
per run of consecutive transient ids: nothing per message when publishers stick to one delivery
mode); ids recovered at open are two sorted ``array('Q')`` (8 bytes each); requeued ids are a heap;
unacked ids a set (plus a set of the transient ones among the delivered). Bodies live in RocksDB
and are read on ``pop``, whatever their persistence; only messages whose write has not completed
yet stay in memory, as ``Message`` objects. The broker polls ``needs_flush`` (a few times a
second), which takes in completed flushes, so that a queue nobody consumes holds at most the
bodies of the last fraction of a second in memory. ``ready_bytes`` is a running total (the unacked
ids map to their body sizes, so a requeue adds them back); ``open_queue`` of a recovered queue
sums the body sizes from the record headers as it scans the queue's records. ``peek`` is ``pop``
without taking: the same walk, which may skip a vanished record or ask for a reservation.

Ids. ``open`` raises the database's run counter (the *epoch*) with a synced write, and the
messages pushed in run ``e`` get ids from ``e << 40`` up: recovered messages keep their ids, new
ones are always greater, and an id is never handed out twice, even when a crash lost the messages
(and deliveries) of the end of a run. A queue's new messages hence have consecutive ids.

Delivery state. Fresh messages are popped in id order and requeued ones are always older, so what
a queue has delivered is one number, its *cursor* (the oldest never-popped fresh id). Each queue
persists a *delivery reservation* ``D`` ahead of its pops: no persistent message at or above the
durable ``D`` is ever popped, so after a restart a survivor below ``D`` comes back flagged
redelivered and one at or above it unflagged. When a pop reaches ``D``, ``pop`` returns ``None``
and ``needs_flush`` turns true; the next flush extends it. ``open_queue`` reserves a first window
(written with the next flush, typically the one confirming the first publish), so that delivery
starts at once and goes on while the disk is full; further reservations are made on demand, for
queues being consumed, to ``cursor + window`` when a pop was refused or less than half the window
is left (the store's ``wants_flush`` asks for that flush early, so that deliveries need not
pause). The window starts at ``reservation_min`` and doubles, up to ``reservation_max``, each time
a consumer got through half of it (so a fast consumer costs a flush every few thousand
deliveries), and halves when less than a quarter was used. ``close`` writes the exact cursor as
``D``, so after a clean shutdown the flags are exact; after a crash, up to one window of
never-delivered messages right after the delivered ones may come back flagged too (the contract's
bounded window; AMQP's redelivered means "may have been delivered"); a delivered one never comes
back unflagged. Transient messages never survive a restart, so popping them needs no reservation.

Threads. The worker thread touches only the sealed list, the durable sequence number, the health
flag and the database handle; the Trio thread learns that a flush completed in ``_reap`` (called
from ``pop``, ``begin_flush`` and ``needs_flush``), which applies its reservations and drops the
written messages from memory. ``_lock`` guards that shared state and is only held for a few list
operations; ``_write_lock`` serialises writers; ``_db_lock`` guards replacing the handle
(reopening after a write error, closing) against the Trio thread's reads.
"""

from __future__ import annotations

import heapq
import logging
import threading
from array import array
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path

from rocksdict import (
    AccessType,
    DbClosedError,
    DBRecoveryMode,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from tqbroker.model import Message

from .codec import (
    EPOCH_SHIFT,
    FORMAT_VERSION,
    MAX_EPOCH,
    MAX_QUEUE_ID,
    META_CLEAN,
    META_EPOCH,
    META_FORMAT,
    META_NEXT_QUEUE_ID,
    REGISTRY,
    TRANSIENT,
    TRANSIENT_END,
    body_size,
    decode_record,
    encode_record,
    is_transient_key,
    message_id_of,
    message_key,
    messages_start,
    pack_u32,
    pack_u64,
    parse_registry_key,
    queue_end,
    queue_id_of,
    queue_prefix,
    registry_key,
    reservation_key,
    transient_end,
    transient_key,
    transient_prefix,
    unpack_u32,
    unpack_u64,
)

log = logging.getLogger("tqbroker.backends.rocksdb")

DB_DIRECTORY = "rocksdb"
"""The database lives in this subdirectory of the ``data_dir`` given to ``open`` (the broker's one
data directory, shared with other backends), so that RocksDB's own file management (it deletes
obsolete ``NNNNNN.log``/``.sst`` files it finds) never meets anyone else's files."""

_Value = Message | bytes | None


def _storage_error(exc: BaseException) -> OSError:
    """rocksdict raises plain ``Exception`` (and ``DbClosedError``) for RocksDB errors."""
    if isinstance(exc, OSError):
        return exc
    return OSError(f"RocksDB: {exc}")


def _is_storage_error(exc: BaseException) -> bool:
    return type(exc) is Exception or isinstance(exc, OSError | DbClosedError)


class _Batch:
    """The writes of one flush, in the order they must be applied."""

    __slots__ = ("ops", "ranges", "reservations", "seq")

    def __init__(
        self,
        seq: int,
        ops: dict[bytes, _Value],
        ranges: list[tuple[bytes, bytes]],
        reservations: list[tuple[RocksDBQueueStore, int]],
    ) -> None:
        self.seq = seq
        self.ops = ops
        self.ranges = ranges
        self.reservations = reservations

    def apply(self, batch: WriteBatch) -> bool:
        """Add the writes to ``batch``; return whether any of them asks for an fsync, i.e.
        touches anything but transient messages (which are written only to keep their bodies
        out of memory, and never synced for their own sake)."""
        # Point operations first, then range deletes: a range (a purge or a deleted queue) only
        # covers ids that existed when it was recorded, and a point key is never written again
        # after a range covering it, so this order is the order the operations happened in.
        sync = bool(self.reservations)
        for key, value in self.ops.items():
            if not sync and not is_transient_key(key):
                sync = True
            if value is None:
                batch.delete(key)
            elif isinstance(value, Message):
                batch.put(key, encode_record(value))
            else:
                batch.put(key, value)
        for begin, end in self.ranges:
            if not sync and not is_transient_key(begin):
                sync = True
            batch.delete_range(begin, end)
        return sync


class RocksDBQueueStore:
    """The messages of one queue; see the module docstring for the layout."""

    def __init__(
        self,
        backend: RocksDBBackend,
        qid: int,
        *,
        next_id: int = 1,
        reserved: int = 0,
        flagged: array[int] | None = None,
        fresh: array[int] | None = None,
        ready_bytes: int = 0,
    ) -> None:
        self._backend = backend
        self.qid = qid
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
        self._reserved = reserved  # durable delivery reservation: pop checks this
        self._reserve_target = reserved  # highest reservation recorded in a batch
        self._popped = 0  # persistent fresh pops since the last extension (sizes the next one)
        self._window = backend.reservation_min  # the window of the last reservation
        self._id_limit = backend._id_limit
        self._deleted = False

    # -- QueueStore ----------------------------------------------------------------------------

    def push(self, message: Message, persistent: bool = False) -> int:
        message_id = self._next_id
        if message_id >= self._id_limit:
            raise RuntimeError("this run used up its 2**40 message ids: restart the broker")
        self._next_id += 1
        backend = self._backend
        backend._pushed.add(self)
        self._pending[message_id] = message
        self._ready_bytes += len(message.body)
        if self._deleted:
            self._add_transient(message_id)  # never written: like a transient message
        elif persistent:
            backend._ops[message_key(self._prefix, message_id)] = message
        else:
            self._add_transient(message_id)
            backend._ops[transient_key(self._transient_prefix, message_id)] = message
        return message_id

    def peek(self) -> tuple[int, Message, bool] | None:
        self._backend._reap()
        head = self._head()
        return None if head is None else head[:3]

    def pop(self) -> tuple[int, Message, bool] | None:
        backend = self._backend
        backend._reap()
        backend._active.add(self)  # someone consumes: plan a reservation at the next flush
        head = self._head()
        if head is None:
            return None
        message_id, message, flagged, transient = head
        if flagged:
            self._take_flagged(message_id)
        else:
            self._take_fresh()
            if transient:
                self._transient_out.add(message_id)
            else:
                self._popped += 1
        size = len(message.body)
        self._ready_bytes -= size
        self._unacked[message_id] = size
        return message_id, message, flagged

    def _head(self) -> tuple[int, Message, bool, bool] | None:
        """The next message ``pop`` takes, as ``(id, message, flagged, transient)``: flagged
        ones (requeued, or recovered below the reservation) are redelivered; ``transient`` is
        known for fresh ones only. None when nothing is ready, or when the reservation must be
        extended first (the next flush then extends it). Messages whose record has vanished
        are skipped for good."""
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
            if not transient and message_id >= self._reserved:
                self._backend._wanting.add(self)
                return None
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
            ops = self._backend._ops
            for message_id in [i for i in self._pending if i >= head]:
                del self._pending[message_id]
                transient = self._is_fresh_transient(message_id)
                key = self._key(message_id, transient)
                if isinstance(ops.get(key), Message):
                    del ops[key]
                    cancelled[transient] += 1
            if not self._deleted:
                ranges = self._backend._ranges
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
        return head is not None and self._reserve_target - head < self._window // 2

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

    def _cursor(self) -> int:
        """The oldest fresh (never popped) id; every fresh id below it has been popped."""
        head = self._fresh_head()
        return self._next_id if head is None else head

    def _load(self, message_id: int, transient: bool) -> Message | None:
        message = self._pending.get(message_id)
        if message is not None:
            return message
        record = self._backend._read(self._key(message_id, transient))
        if record is None:
            log.error("queue %d: message %d has no record; skipping it", self.qid, message_id)
            return None
        return decode_record(record)

    def _forget(self, message_id: int, transient: bool) -> None:
        """Drop a message for good (acked or purged)."""
        self._pending.pop(message_id, None)
        if self._deleted:
            return
        ops = self._backend._ops
        key = self._key(message_id, transient)
        if isinstance(ops.get(key), Message):
            del ops[key]  # its put was never sealed: it never reaches the disk
        else:
            ops[key] = None


class RocksDBBackend:
    """Registered as the ``rocksdb`` backend.

    ``reservation_min``/``reservation_max`` bound the delivery reservation window (how many
    persistent messages a queue may deliver between two flushes, and how many never-delivered
    ones may come back flagged redelivered after a crash); ``sync`` false skips the fsync of
    flushes (for tests and benchmarks only: flushed messages then survive the process dying but
    not the machine).
    """

    name = "rocksdb"
    durable = True

    def __init__(
        self, *, reservation_min: int = 64, reservation_max: int = 8192, sync: bool = True
    ) -> None:
        if not 1 <= reservation_min <= reservation_max:
            raise ValueError("need 1 <= reservation_min <= reservation_max")
        self.reservation_min = reservation_min
        self.reservation_max = reservation_max
        self._sync = sync
        self._write_options = WriteOptions()
        self._write_options.sync = False  # made durable by flush_wal(True): see the module doc
        self._path: Path | None = None
        self._db: Rdict | None = None
        self._opened = False
        self._broken = False  # the handle saw a write error: reopen it before writing again
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._db_lock = threading.Lock()
        # Current batch (Trio thread only).
        self._ops: dict[bytes, _Value] = {}
        self._ranges: list[tuple[bytes, bytes]] = []
        self._reservations: list[tuple[RocksDBQueueStore, int]] = []
        # Shared with the flush thread, under _lock.
        self._sealed: list[_Batch] = []
        self._done: list[_Batch] = []
        self._durable_seq = 0
        self._healthy = True
        self._seq = 0
        self._stores: dict[tuple[str, str], RocksDBQueueStore] = {}
        self._by_qid: dict[int, RocksDBQueueStore] = {}
        self._registry: dict[tuple[str, str], int] = {}
        self._next_qid = 1
        self._id_base = 1  # this run's first message id (see codec.META_EPOCH)
        self._id_limit = 1 << EPOCH_SHIFT
        self._pushed: set[RocksDBQueueStore] = set()  # pushed to since the last flush
        self._active: set[RocksDBQueueStore] = set()  # pop called since the last flush
        self._wanting: set[RocksDBQueueStore] = set()  # pop refused: reservation exhausted
        self._consuming: set[RocksDBQueueStore] = set()  # active or wanting at the last flush
        self.recovered_cleanly: bool | None = None
        """After ``open``: ``None`` for a new database, else whether the previous run closed it
        cleanly (informational: recovery is the same either way)."""

    # -- Backend -------------------------------------------------------------------------------

    def open(self, data_dir: Path) -> None:
        if self._opened:
            raise RuntimeError("the rocksdb backend is already open")
        path = Path(data_dir) / DB_DIRECTORY
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._path = path
            db = self._db = self._open_db()
            self._opened = True
            self._recover_metadata(db)
        except Exception as exc:
            self._abandon()
            if _is_storage_error(exc):
                raise _storage_error(exc) from exc
            raise

    def open_queue(self, vhost: str, queue: str) -> RocksDBQueueStore:
        name = (vhost, queue)
        store = self._stores.get(name)
        if store is not None:
            return store
        if not self._opened:
            raise RuntimeError("the rocksdb backend is not open")
        qid = self._registry.get(name)
        if qid is None:
            if self._next_qid > MAX_QUEUE_ID:
                raise RuntimeError("out of queue ids")
            qid = self._next_qid
            self._next_qid += 1
            self._registry[name] = qid
            self._ops[registry_key(vhost, queue)] = pack_u32(qid)
            self._ops[META_NEXT_QUEUE_ID] = pack_u32(self._next_qid)
            store = RocksDBQueueStore(self, qid, next_id=self._id_base)
        else:
            store = self._recover(qid)
        self._stores[name] = store
        self._by_qid[qid] = store
        # A first delivery window, durable with the next flush, so that delivery starts without
        # waiting for one of its own, and goes on while the disk is full (no write succeeds then).
        self._extend(store, store._cursor() + store._window)
        return store

    def delete_queue(self, vhost: str, queue: str) -> None:
        name = (vhost, queue)
        store = self._stores.pop(name, None)
        qid = self._registry.pop(name, None)
        if store is not None:
            self._by_qid.pop(store.qid, None)
            store._deleted = True
            for message_id in store._pending:  # unwritten puts: cancel them
                for key in (
                    message_key(store._prefix, message_id),
                    transient_key(store._transient_prefix, message_id),
                ):
                    if isinstance(self._ops.get(key), Message):
                        del self._ops[key]
            self._ops.pop(reservation_key(store._prefix), None)
            self._reservations = [r for r in self._reservations if r[0] is not store]
            store._pending.clear()
            store._runs, store._runs_pos = array("Q"), 0
            store._transient_out.clear()
            for tracked in (self._pushed, self._active, self._wanting, self._consuming):
                tracked.discard(store)
        if qid is not None:
            self._ops[registry_key(vhost, queue)] = None
            self._ranges.append((queue_prefix(qid), queue_end(qid)))
            self._ranges.append((transient_prefix(qid), transient_end(qid)))

    @property
    def needs_flush(self) -> bool:
        # The broker polls this: take in a completed flush now, so that the bodies it wrote
        # leave memory even when nothing else happens (no consumer, no further publish).
        self._reap()
        return bool(self._ops or self._ranges or self._wanting) or (
            not self._healthy and bool(self._sealed)
        )

    @property
    def healthy(self) -> bool:
        return self._healthy

    def begin_flush(self) -> Callable[[], None] | None:
        if not self._opened:
            return None
        self._reap()
        self._plan_reservations()
        retry = not self._healthy and bool(self._sealed)
        self._pushed.clear()
        if not (self._ops or self._ranges or retry):
            return None
        seq = self._seal()
        return lambda: self._write_through(seq)

    def close(self) -> None:
        if not self._opened:
            return
        try:
            self._reap()
            # Exact delivery state: every fresh id below a queue's cursor has been delivered,
            # none at or above it.
            for store in self._stores.values():
                self._ops[reservation_key(store._prefix)] = pack_u64(store._cursor())
            self._ops[META_CLEAN] = b"1"
            self._write_through(self._seal())
        finally:
            with self._write_lock:
                self._abandon()

    # -- writing (the flush thread) ------------------------------------------------------------

    def _seal(self) -> int:
        self._seq += 1
        batch = _Batch(self._seq, self._ops, self._ranges, self._reservations)
        self._ops, self._ranges, self._reservations = {}, [], []
        with self._lock:
            self._sealed.append(batch)
        return batch.seq

    def _write_through(self, seq: int) -> None:
        """Make batch ``seq`` durable, with every batch sealed before it (and any sealed since)."""
        with self._write_lock:
            with self._lock:
                if self._durable_seq >= seq:
                    return  # a later flush's write carried it
                batches = list(self._sealed)
            if not batches:
                raise OSError("the rocksdb backend was closed before this flush ran")
            try:
                if self._broken:
                    self._reopen()
                db = self._db
                if db is None:
                    raise OSError("the rocksdb backend is closed")
                write_batch = WriteBatch(raw_mode=True)
                sync = False
                for batch in batches:
                    sync = batch.apply(write_batch) or sync
                db.write(write_batch, self._write_options)  # holds the GIL: no fsync here
                if sync and self._sync:
                    db.flush_wal(True)  # the fsync, without the GIL
            except Exception as exc:
                with self._lock:
                    self._healthy = False
                if not _is_storage_error(exc):
                    raise
                self._broken = True
                raise _storage_error(exc) from exc
            with self._lock:
                del self._sealed[: len(batches)]
                self._done.extend(batches)
                self._durable_seq = batches[-1].seq
                self._healthy = True

    def _reopen(self) -> None:
        """After a write error RocksDB refuses every write until the database is reopened (the
        failed handle still serves reads). Reopening read-write can itself fail while the disk
        is full (recovery writes the replayed log to a table file): then open it read-only, so
        that reads go on, and try again at the next flush."""
        log.warning("reopening the RocksDB database in %s after a write error", self._path)
        with self._db_lock:
            db, self._db = self._db, None
            if db is not None:
                try:
                    db.close()
                except Exception as exc:
                    if not _is_storage_error(exc):
                        raise
                    log.debug("closing the failed RocksDB handle: %s", exc)
            try:
                self._db = self._open_db()
            except Exception as exc:
                if not _is_storage_error(exc):
                    raise
                try:
                    self._db = self._open_db(read_only=True)
                except Exception as again:
                    if not _is_storage_error(again):
                        raise
                    log.error("cannot even open %s read-only: %s", self._path, again)
                raise
        self._broken = False

    def _open_db(self, *, read_only: bool = False) -> Rdict:
        assert self._path is not None
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Recover up to the last consistent write: a torn tail (an interrupted, unconfirmed
        # write) is dropped; every synced write before it is kept.
        options.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
        options.set_keep_log_file_num(4)
        if read_only:
            return Rdict(str(self._path), options, access_type=AccessType.read_only(False))
        return Rdict(str(self._path), options)

    def _abandon(self) -> None:
        """Close the handle and forget everything (the caller holds ``_write_lock`` or no
        flush can be running)."""
        with self._db_lock:
            db, self._db = self._db, None
        self._opened = False
        self._stores.clear()
        self._by_qid.clear()
        self._registry.clear()
        self._ops, self._ranges, self._reservations = {}, [], []
        for tracked in (self._pushed, self._active, self._wanting):
            tracked.clear()
        self._consuming = set()
        with self._lock:
            self._sealed.clear()
            self._done.clear()
        if db is not None:
            try:
                db.close()
            except Exception as exc:
                if not _is_storage_error(exc):
                    raise
                raise _storage_error(exc) from exc

    # -- the Trio thread's side ----------------------------------------------------------------

    def _read(self, key: bytes) -> bytes | None:
        with self._db_lock:
            db = self._db
            if db is None:
                raise OSError("the rocksdb database is not open")
            try:
                value = db.get(key)
            except Exception as exc:
                if not _is_storage_error(exc):
                    raise
                raise _storage_error(exc) from exc
        assert value is None or isinstance(value, bytes)
        return value

    def _read_u64(self, key: bytes) -> int | None:
        value = self._read(key)
        return None if value is None else unpack_u64(value)

    def _reap(self) -> None:
        """Take in the flushes completed since the last call: their reservations now hold, and
        the messages they wrote are read from RocksDB from now on."""
        if not self._done:
            return
        with self._lock:
            done, self._done = self._done, []
        for batch in done:
            for store, reserved in batch.reservations:
                store._reserved = max(store._reserved, reserved)
            for key, value in batch.ops.items():
                if isinstance(value, Message):
                    owner = self._by_qid.get(queue_id_of(key))
                    if owner is not None:
                        owner._pending.pop(message_id_of(key), None)

    def _plan_reservations(self) -> None:
        # Queues with consumers: popped or refused since the last flush, or popped before it and
        # pushed to since (their consumers are waiting for the new messages). "Running low" is
        # judged against the current window, as ``wants_flush`` does.
        candidates = self._wanting | self._active | (self._pushed & self._consuming)
        for store in candidates:
            cursor = store._cursor()
            if store in self._wanting or store._reserve_target - cursor < store._window // 2:
                # Slow start: a consumer that got through half the window since the last
                # extension gets twice as much; one that used less than a quarter, half.
                popped, store._popped = store._popped, 0
                window = store._window
                if popped >= window // 2:
                    window = min(self.reservation_max, 2 * window)
                elif popped < window // 4:
                    window = max(self.reservation_min, window // 2)
                store._window = window
                self._extend(store, cursor + window)
        self._consuming = self._wanting | self._active
        self._wanting.clear()
        self._active.clear()

    def _extend(self, store: RocksDBQueueStore, reservation: int) -> None:
        if reservation > store._reserve_target:
            store._reserve_target = reservation
            self._ops[reservation_key(store._prefix)] = pack_u64(reservation)
            self._reservations.append((store, reservation))

    # -- recovery ------------------------------------------------------------------------------

    def _recover_metadata(self, db: Rdict) -> None:
        """At ``open``: check the format, start a new run (epoch), load the queue registry."""
        stored_format = db.get(META_FORMAT)
        start = WriteBatch(raw_mode=True)
        if stored_format is None:
            if next(iter(db.keys()), None) is not None:
                raise RuntimeError(f"{self._path} holds a database that is not tqbroker's")
            start.put(META_FORMAT, FORMAT_VERSION)
            epoch = 0
        elif stored_format != FORMAT_VERSION:
            raise RuntimeError(f"{self._path}: unsupported format {stored_format!r}")
        else:
            self.recovered_cleanly = db.get(META_CLEAN) is not None
            start.delete(META_CLEAN)
            # Transient messages never survive a restart, clean or not.
            start.delete_range(TRANSIENT, TRANSIENT_END)
            stored_epoch = db.get(META_EPOCH)
            epoch = unpack_u64(stored_epoch) + 1 if stored_epoch is not None else 1
            if epoch > MAX_EPOCH:
                raise RuntimeError(f"{self._path}: out of run epochs")
        # Durable before any id of this run is handed out, so none is ever handed out twice.
        start.put(META_EPOCH, pack_u64(epoch))
        sync = WriteOptions()
        sync.sync = self._sync
        db.write(start, sync)
        self._id_base = max(1, epoch << EPOCH_SHIFT)
        self._id_limit = (epoch + 1) << EPOCH_SHIFT
        next_qid = db.get(META_NEXT_QUEUE_ID)
        self._next_qid = unpack_u32(next_qid) if next_qid is not None else 1
        for key, value in db.items(from_key=REGISTRY):
            if not isinstance(key, bytes) or not key.startswith(REGISTRY):
                break
            qid = unpack_u32(value)
            self._registry[parse_registry_key(key)] = qid
            self._next_qid = max(self._next_qid, qid + 1)

    def _recover(self, qid: int) -> RocksDBQueueStore:
        prefix = queue_prefix(qid)
        # Every message below the reservation may have been delivered; none above it was.
        reserved = self._read_u64(reservation_key(prefix)) or 0
        next_id = max(self._id_base, reserved)
        flagged: array[int] = array("Q")
        fresh: array[int] = array("Q")
        ready_bytes = 0
        start = messages_start(prefix)
        with self._db_lock:
            db = self._db
            if db is None:
                raise OSError("the rocksdb database is not open")
            try:
                for key, record in db.items(from_key=start):
                    if not isinstance(key, bytes) or not key.startswith(start):
                        break
                    message_id = message_id_of(key)
                    (flagged if message_id < reserved else fresh).append(message_id)
                    next_id = max(next_id, message_id + 1)
                    ready_bytes += body_size(record)
            except Exception as exc:
                if not _is_storage_error(exc):
                    raise
                raise _storage_error(exc) from exc
        return RocksDBQueueStore(
            self,
            qid,
            next_id=next_id,
            reserved=reserved,
            flagged=flagged,
            fresh=fresh,
            ready_bytes=ready_bytes,
        )
