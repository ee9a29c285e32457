"""The write side of the RocksDB backend: the current batch, sealing, and write-through.

Responsibilities:
- ``Batch``: the writes of one flush (puts, deletes, range deletes, reservations made);
- ``Writer``: the database handle and its locks, the current batch (Trio thread), the sealed and
  completed batches shared with the flusher's worker thread, writing sealed batches through
  (``write_through``), reopening the database after a write error, and closing it.

See "RocksDB backend" in docs/storage-format.md for why a write is unsynced plus ``flush_wal``.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rocksdict import (
    AccessType,
    DbClosedError,
    DBRecoveryMode,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from tqbroker.backends import Message

from .codec import encode_record, is_transient_key, unpack_u64

if TYPE_CHECKING:
    from .reservations import Reservation

log = logging.getLogger(__name__)

Value = Message | bytes | None
"""A write of the current batch: a ``Message`` (a put, encoded in the worker), ``bytes`` (a put)
or ``None`` (a delete)."""


def storage_error(exc: BaseException) -> OSError:
    """rocksdict raises plain ``Exception`` (and ``DbClosedError``) for RocksDB errors."""
    if isinstance(exc, OSError):
        return exc
    return OSError(f"RocksDB: {exc}")


def open_error(path: Path, exc: BaseException) -> OSError:
    """A storage error met opening the database in ``path``, saying where (rocksdict's own
    errors do not, e.g. "No space left on device (os error 28)"), with ``errno`` ENOSPC for a
    full disk."""
    detail = str(storage_error(exc)).removeprefix("RocksDB: ")
    error = OSError(f"cannot open the RocksDB database in {path}: {detail}")
    error.errno = exc.errno if isinstance(exc, OSError) else None
    if error.errno is None and is_no_space(exc):
        error.errno = errno.ENOSPC
    return error


def is_storage_error(exc: BaseException) -> bool:
    return type(exc) is Exception or isinstance(exc, OSError | DbClosedError)


_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXTS = tuple(os.strerror(code) for code in _NO_SPACE_ERRNOS)


def is_no_space(exc: BaseException) -> bool:
    """A storage error saying the disk (or the quota) is full: RocksDB's ``IO error: No space
    left on device`` (rocksdict raises a plain ``Exception`` with RocksDB's message)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in _NO_SPACE_ERRNOS
    return is_storage_error(exc) and any(text in str(exc) for text in _NO_SPACE_TEXTS)


def _close(db: Rdict) -> None:
    """Close a handle; a storage error is raised as ``OSError``."""
    try:
        db.close()
    except Exception as exc:
        if not is_storage_error(exc):
            raise
        raise storage_error(exc) from exc


class Batch:
    """The writes of one flush, in the order they must be applied."""

    __slots__ = ("ops", "ranges", "reservations", "seq")

    def __init__(
        self,
        seq: int,
        ops: dict[bytes, Value],
        ranges: list[tuple[bytes, bytes]],
        reservations: list[tuple[Reservation, int]],
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


class Writer:
    """The database handle and the batches on their way to it.

    The Trio thread records writes in ``ops``, ``ranges`` and ``reservations`` (the current
    batch) and seals it with ``seal``; the flusher's worker thread runs ``write_through``. The
    worker touches only the sealed list, the durable sequence number, the health flag and the
    handle. ``_lock`` guards that shared state (held for a few list operations only),
    ``_write_lock`` serialises writers, ``_db_lock`` guards replacing the handle (reopening,
    closing) against the Trio thread's reads.
    """

    def __init__(self, *, sync: bool) -> None:
        self.sync = sync
        """False skips the fsync of flushes (tests and benchmarks only)."""
        self._write_options = WriteOptions()
        self._write_options.sync = False  # made durable by flush_wal(True)
        self._path: Path | None = None
        self._db: Rdict | None = None
        self._broken = False  # the handle saw a write error: reopen it before writing again
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._db_lock = threading.Lock()
        # The current batch (Trio thread only).
        self.ops: dict[bytes, Value] = {}
        self.ranges: list[tuple[bytes, bytes]] = []
        self.reservations: list[tuple[Reservation, int]] = []
        # Shared with the flush thread, under _lock.
        self._sealed: list[Batch] = []
        self._done: list[Batch] = []
        self._durable_seq = 0
        self._healthy = True
        self._seq = 0

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def has_writes(self) -> bool:
        """The current batch holds writes."""
        return bool(self.ops or self.ranges)

    @property
    def must_retry(self) -> bool:
        """A write failed and sealed batches wait to be written again."""
        return not self._healthy and bool(self._sealed)

    def open(self, path: Path) -> Rdict:
        """Open (creating) the database in ``path``. On a full disk it is opened read-only
        instead (``read_only`` true): RocksDB writes a new MANIFEST at every read-write open,
        and no option avoids it. Reads go on; the writer is broken, so the first flush that has
        something to write reopens it read-write (and fails, read-only again, while the disk is
        still full). Healthy until then, as the log backend on a full disk: a backend nothing
        writes to (not the durable one) does not fail the broker's health check."""
        self._path = path
        try:
            db = self._db = self._open_db()
        except Exception as exc:
            if not is_no_space(exc):
                raise
            try:
                db = self._db = self._open_db(read_only=True)
            except Exception as again:
                if not is_storage_error(again):
                    raise
                raise exc from None  # a new database, say: why the read-write open failed
            log.warning(
                "no space left on device for RocksDB to open %s read-write: opened read-only, "
                "every write waits until there is space (%s)",
                path,
                exc,
            )
            self._broken = True
        return db

    @property
    def read_only(self) -> bool:
        """The handle is read-only (opened on a full disk, or reopened after a write error
        while the disk was still full): no write can succeed before a reopen."""
        return self._broken

    def defer(self, ops: Mapping[bytes, bytes | None], ranges: list[tuple[bytes, bytes]]) -> None:
        """Seal ``ops`` then ``ranges`` as a batch of their own, written (before anything
        recorded later) by the first flush that can write: for the writes that start a run
        when the database could only be opened read-only."""
        assert not self.has_writes
        assert not self.reservations
        self.ops, self.ranges = dict(ops), list(ranges)
        self.seal()

    # -- writing (the flush thread) ------------------------------------------------------------

    def seal(self) -> int:
        """Seal the current batch (Trio thread); return its sequence number for
        ``write_through``."""
        self._seq += 1
        batch = Batch(self._seq, self.ops, self.ranges, self.reservations)
        self.ops, self.ranges, self.reservations = {}, [], []
        with self._lock:
            self._sealed.append(batch)
        return batch.seq

    def write_through(self, seq: int) -> None:
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
                if sync and self.sync:
                    db.flush_wal(True)  # the fsync, without the GIL
            except Exception as exc:
                with self._lock:
                    self._healthy = False
                if not is_storage_error(exc):
                    raise
                self._broken = True
                raise storage_error(exc) from exc
            with self._lock:
                del self._sealed[: len(batches)]
                self._done.extend(batches)
                self._durable_seq = batches[-1].seq
                self._healthy = True

    def take_completed(self) -> list[Batch]:
        """The batches written since the last call (Trio thread)."""
        if not self._done:
            return []
        with self._lock:
            done, self._done = self._done, []
        return done

    def _reopen(self) -> None:
        """After a write error RocksDB refuses every write until the database is reopened (the
        failed handle still serves reads). Reopening read-write can itself fail while the disk
        is full (recovery writes the replayed log to a table file): then open it read-only, so
        that reads go on, and try again at the next flush."""
        log.warning("reopening the RocksDB database in %s read-write to write", self._path)
        with self._db_lock:
            db, self._db = self._db, None
            if db is not None:
                try:
                    _close(db)
                except OSError as exc:
                    log.debug("closing the failed RocksDB handle: %s", exc)
            try:
                self._db = self._open_db()
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                try:
                    self._db = self._open_db(read_only=True)
                except Exception as again:
                    if not is_storage_error(again):
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

    def abandon(self) -> None:
        """Close the handle and forget every batch, written or not (after a running flush)."""
        with self._write_lock:
            with self._db_lock:
                db, self._db = self._db, None
            self.ops, self.ranges, self.reservations = {}, [], []
            with self._lock:
                self._sealed.clear()
                self._done.clear()
            if db is not None:
                _close(db)

    # -- reading (the Trio thread) -------------------------------------------------------------

    def read(self, key: bytes) -> bytes | None:
        with self._db_lock:
            db = self._db
            if db is None:
                raise OSError("the rocksdb database is not open")
            try:
                value = db.get(key)
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                raise storage_error(exc) from exc
        assert value is None or isinstance(value, bytes)
        return value

    def read_u64(self, key: bytes) -> int | None:
        value = self.read(key)
        return None if value is None else unpack_u64(value)

    @contextmanager
    def reading(self) -> Iterator[Rdict]:
        """The handle, kept from being replaced meanwhile; storage errors raise ``OSError``."""
        with self._db_lock:
            db = self._db
            if db is None:
                raise OSError("the rocksdb database is not open")
            try:
                yield db
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                raise storage_error(exc) from exc
