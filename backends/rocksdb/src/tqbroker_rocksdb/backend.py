"""The RocksDB backend: every durable queue of a broker in one RocksDB database.

Responsibilities: the ``Backend`` contract (open, open and delete queues, flush, close), the
queue registry, and taking in completed flushes. ``open_queue`` (a queue's recovery scan) and
``delete_queue`` may run in a worker thread: the registry and the current batch's writes they
touch are guarded by a lock, never held during the scan. The queues' index is ``store.py``, the
writes ``writer.py``, delivery reservations ``reservations.py``, recovery ``recovery.py``, keys and
records ``codec.py``. The design is in docs/storage-format.md, "RocksDB backend".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from tqbroker.backends import Message, StorageEnv

from .codec import (
    EPOCH_SHIFT,
    MAX_QUEUE_ID,
    META_CLEAN,
    META_NEXT_QUEUE_ID,
    message_id_of,
    pack_u32,
    pack_u64,
    queue_end,
    queue_id_of,
    queue_prefix,
    registry_key,
    transient_end,
    transient_prefix,
)
from .recovery import RecoveredQueue, scan_queue, start_run
from .reservations import ReservationPlanner
from .store import RocksDBQueueStore
from .writer import Writer, is_storage_error, open_error

log = logging.getLogger(__name__)

DB_DIRECTORY = "rocksdb"
"""The database lives in this subdirectory of the ``data_dir`` given to ``open`` (the broker's one
data directory, shared with other backends), so that RocksDB's own file management (it deletes
obsolete ``NNNNNN.log``/``.sst`` files it finds) never meets anyone else's files."""


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
        self.writer = Writer(sync=sync)
        self.reservations = ReservationPlanner(self.writer, reservation_min, reservation_max)
        self._opened = False
        # Guards the registry and the current batch against a worker thread's open or delete.
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, str], RocksDBQueueStore] = {}
        self._by_qid: dict[int, RocksDBQueueStore] = {}
        self._registry: dict[tuple[str, str], int] = {}
        self._next_qid = 1
        self._id_base = 1  # this run's first message id (see codec.META_EPOCH)
        self._id_limit = 1 << EPOCH_SHIFT
        self.recovered_cleanly: bool | None = None
        """After ``open``: ``None`` for a new database, else whether the previous run closed it
        cleanly (informational: recovery is the same either way)."""

    # -- Backend -------------------------------------------------------------------------------

    def open(self, data_dir: Path, env: StorageEnv | None = None) -> None:
        if self._opened:
            raise RuntimeError("the rocksdb backend is already open")
        path = Path(data_dir) / DB_DIRECTORY
        env = StorageEnv.default() if env is None else env
        try:
            env.make_dirs(path)  # its entry in data_dir durable: RocksDB syncs only its own
            db = self.writer.open(path)
            self._opened = True
            run = start_run(self.writer, db, path)
            self.recovered_cleanly = run.recovered_cleanly
            self._id_base, self._id_limit = run.id_base, run.id_limit
            self._next_qid = run.next_qid
            self._registry = run.registry
        except Exception as exc:
            self._abandon()
            if is_storage_error(exc):
                raise open_error(path, exc) from exc
            raise

    def open_queue(self, vhost: str, queue: str) -> RocksDBQueueStore:
        name = (vhost, queue)
        with self._lock:
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
                ops = self.writer.ops
                ops[registry_key(vhost, queue)] = pack_u32(qid)
                ops[META_NEXT_QUEUE_ID] = pack_u32(self._next_qid)
                found: RecoveredQueue | None = RecoveredQueue.empty(self._id_base)
            else:
                found = None
        if found is None:
            found = scan_queue(self.writer, qid, self._id_base)  # blocking, without the lock
        store = RocksDBQueueStore(
            qid,
            writer=self.writer,
            planner=self.reservations,
            reap=self.reap,
            id_limit=self._id_limit,
            next_id=found.next_id,
            reserved=found.reserved,
            flagged=found.flagged,
            fresh=found.fresh,
            ready_bytes=found.ready_bytes,
        )
        with self._lock:
            existing = self._stores.get(name)
            if existing is not None:  # opened meanwhile by another thread
                return existing
            self._stores[name] = store
            self._by_qid[qid] = store
            # A first delivery window, durable with the next flush, so that delivery starts
            # without waiting for one of its own, and goes on while the disk is full (no write
            # succeeds then).
            self.reservations.extend(store, store.cursor() + store.reservation.window)
        return store

    def delete_queue(self, vhost: str, queue: str) -> None:
        name = (vhost, queue)
        with self._lock:
            store = self._stores.pop(name, None)
            qid = self._registry.pop(name, None)
            if store is not None:
                self._by_qid.pop(store.qid, None)
                store.delete()
                self.reservations.forget(store)
            if qid is not None:
                self.writer.ops[registry_key(vhost, queue)] = None
                self.writer.ranges.append((queue_prefix(qid), queue_end(qid)))
                self.writer.ranges.append((transient_prefix(qid), transient_end(qid)))

    @property
    def needs_flush(self) -> bool:
        # The broker polls this: take in a completed flush now, so that the bodies it wrote
        # leave memory even when nothing else happens (no consumer, no further publish).
        self.reap()
        writer = self.writer
        return writer.has_writes or bool(self.reservations.wanting) or writer.must_retry

    @property
    def healthy(self) -> bool:
        return self.writer.healthy

    def begin_flush(self) -> Callable[[], None] | None:
        if not self._opened:
            return None
        self.reap()
        writer = self.writer
        with self._lock:  # not while a worker thread registers a queue in this batch
            self.reservations.plan()
            if not (writer.has_writes or writer.must_retry):
                return None
            seq = writer.seal()
        return lambda: writer.write_through(seq)

    def close(self) -> None:
        if not self._opened:
            return
        try:
            self.reap()
            # Exact delivery state: every fresh id below a queue's cursor has been delivered,
            # none at or above it.
            ops = self.writer.ops
            with self._lock:
                stores = list(self._stores.values())
            for store in stores:
                ops[store.reservation.key] = pack_u64(store.cursor())
            ops[META_CLEAN] = b"1"
            self.writer.write_through(self.writer.seal())
        finally:
            self._abandon()

    # -- internals -----------------------------------------------------------------------------

    def reap(self) -> None:
        """Take in the flushes completed since the last call: their reservations now hold, and
        the messages they wrote are read from RocksDB from now on (stores call this before
        reading)."""
        for batch in self.writer.take_completed():
            for reservation, reserved in batch.reservations:
                reservation.grant(reserved)
            for key, value in batch.ops.items():
                if isinstance(value, Message):
                    owner = self._by_qid.get(queue_id_of(key))
                    if owner is not None:
                        owner.release_body(message_id_of(key))

    def _abandon(self) -> None:
        """Close the handle and forget everything (waits for a running flush)."""
        self._opened = False
        self._stores.clear()
        self._by_qid.clear()
        self._registry.clear()
        self.reservations.clear()
        self.writer.abandon()
