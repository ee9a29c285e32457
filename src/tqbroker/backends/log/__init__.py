"""The ``log`` backend: every queue is an append-only, segmented log on disk (Kafka's layout).

Responsibilities:
- one directory per queue under ``<data_dir>/log/`` (named by a hash of vhost and queue, with the
  real names in ``queue.cbor``), each holding the segments and the queue's checkpoint;
- group commit: ``begin_flush`` writes out every queue's buffered records and returns one piece of
  blocking work that fsyncs them all, so a single flush covers every message appended since the
  last one; it also makes the deletes since the last one durable (the directory fsync of their
  renames into the trash) and empties the trash. A flush visits only the stores that changed
  since the last one (each says so through ``Log.changed``): with 100k idle durable queues a
  flush costs what changed, not 100k checks;
- a new queue costs nothing on disk: its directory and files are created by its first write
  (``Log.materialize``), their entries made durable by the first flush that syncs (one fsync of
  ``log/`` for every queue created since), before any record in it is confirmed; the queue's
  existence is the definitions file's, and a queue without a directory opens as a new one;
- threads: ``open_queue``/``open_stream`` (recovery) and ``delete_queue`` may run in a worker
  thread while the Trio thread flushes; the registry of open stores is guarded by a lock, and a
  store enters it only once open;
- the ``fsync`` policy:
  ``"batch"`` (default): every flush fsyncs before the broker confirms; a confirmed message
  survives a killed process, a kernel crash and a power loss;
  ``"interval:<ms>"``: flushes write to the page cache and confirm; an fsync happens at most
  every <ms> milliseconds; a killed process loses nothing confirmed, a power loss may lose the
  confirmed messages of the last <ms> (plus one flush);
  ``"never"``: no fsync at all (only at a clean shutdown); a killed process loses nothing
  confirmed, a power loss or kernel crash may lose anything not yet written back by the OS.
  Whatever the policy, recovery after a power loss is consistent: segments not known to be
  fsync'd are rescanned and cut at the first bad record;
- failure: a write error (e.g. a full disk) marks the backend unhealthy (the broker nacks
  publishes) until a flush succeeds again; a failed fdatasync is final until a restart (the
  kernel may have dropped the pages, so a retried fsync proves nothing). The byte grammar of
  every file is in ``docs/storage-format.md``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import cbor2

from ...storage_env import StorageEnv
from .cache import RecordCache
from .log import Log
from .store import LogQueueStore
from .stream import LogStream

log = logging.getLogger(__name__)

FSYNC_POLICIES = ("batch", "interval:<ms>", "never")


def _recover(store: LogQueueStore | LogStream) -> None:
    """Open a store (recovery: blocking); if that fails, close what it opened (no descriptor
    leaks from a failed open, e.g. out of descriptors) and raise."""
    try:
        store.open()
    except BaseException:
        with contextlib.suppress(OSError):
            store.log.close(clean=False)
        raise


def parse_fsync_policy(policy: str) -> float | None:
    """Seconds between fsyncs: 0 for ``batch``, None for ``never``; ValueError otherwise."""
    if policy == "batch":
        return 0.0
    if policy == "never":
        return None
    kind, _, ms = policy.partition(":")
    if kind == "interval" and ms.isdigit() and int(ms) > 0:
        return int(ms) / 1000
    raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, not {policy!r}")


def _queue_dir_name(vhost: str, queue: str) -> str:
    return hashlib.sha256(f"{vhost}\0{queue}".encode()).hexdigest()[:32]


class LogBackend:
    """Registered as the ``log`` backend: a ``Backend`` and a ``StreamBackend``."""

    name = "log"
    durable = True

    def __init__(
        self,
        *,
        fsync: str = "batch",
        segment_bytes: int = 64 * 1024 * 1024,
        index_interval_bytes: int = 4096,
        cache_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.fsync = fsync
        self._fsync_every = parse_fsync_policy(fsync)
        self._last_fsync = time.monotonic()
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.root = Path()
        self.env = StorageEnv.default()  # replaced by the one ``open`` is given
        # The open stores: read and changed under _lock (opens may run in a worker thread).
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], LogQueueStore] = {}
        self._streams: dict[tuple[str, str], LogStream] = {}
        self._trash: list[Path] = []  # renamed there; not yet durable nor removed
        self._abandoned: list[LogQueueStore | LogStream] = []  # deleted; closed by the next flush
        # The stores with something for the next flush to do (their ``Log.changed`` puts them
        # here): a flush costs what changed, not the number of queues. Under _lock.
        self._dirty: dict[LogQueueStore | LogStream, None] = {}
        self._sync_failed = False  # a store's fdatasync failed: see ``begin_flush``
        # Hot records of all queues, served from memory while they are in an active segment.
        self.cache = RecordCache(cache_bytes)
        self._healthy = True
        # Directories with new entries not yet synced (the data directory once log/ is created
        # in it, log/ once a queue's directory is): the next flush that syncs anything syncs
        # them first, before anything written below them is confirmed. Under _lock.
        self._unsynced_dirs: set[Path] = set()

    def open(self, data_dir: Path, env: StorageEnv | None = None) -> None:
        if env is not None:
            self.env = env
        self.root = data_dir / "log"
        if not self.root.is_dir():
            self.env.fs.mkdir(self.root, parents=True, exist_ok=True)
            # Its entry: made durable by the first flush that syncs (a worker thread; this is
            # the Trio thread), before anything written in it is confirmed.
            with self._lock:
                self._unsynced_dirs.add(data_dir)
        trash = self.root / ".trash"
        if trash.exists():
            self.env.fs.rmtree(trash)

    def open_queue(self, vhost: str, queue: str) -> LogQueueStore:
        key = (vhost, queue)
        with self._lock:
            store = self._queues.get(key)
            if store is not None:
                return store
            if key in self._streams:
                raise ValueError(f"{queue!r} in vhost {vhost!r} is a stream")
        # A new queue's log is absent until its first write (``Log.materialize``): a declare
        # creates nothing on disk.
        directory = self.root / _queue_dir_name(vhost, queue)
        queue_log = self._log(directory, self.segment_bytes, lazy=True)
        queue_log.on_materialize = functools.partial(self._created, directory, vhost, queue)
        store = LogQueueStore(directory, queue_log)
        _recover(store)
        with self._lock:
            found = self._queues.setdefault(key, store)
        if found is not store:  # opened by another thread meanwhile: keep one
            store.log.close(clean=False)
        else:
            self._track(store)
        return found

    def open_stream(
        self, vhost: str, stream: str, *, segment_bytes: int | None = None
    ) -> LogStream:
        """The log of a stream queue (``x-queue-type=stream``): created empty if new, recovered
        if it existed. ``delete_queue`` deletes it."""
        key = (vhost, stream)
        with self._lock:
            found = self._streams.get(key)
            if found is not None:
                return found
            if key in self._queues:
                raise ValueError(f"{stream!r} in vhost {vhost!r} is not a stream")
        directory = self._directory(vhost, stream)
        store = LogStream(directory, self._log(directory, segment_bytes or self.segment_bytes))
        _recover(store)
        # Its replica id is an identity a cluster records (in the partition's ISR) before
        # anything in it is confirmed: the directory holding it is durable now, not at the next
        # flush that syncs (an empty stream may have none before a power cut, and come back a
        # stranger to its ISR).
        self._sync_new_dirs()
        with self._lock:
            found = self._streams.setdefault(key, store)
        if found is not store:  # opened by another thread meanwhile: keep one
            store.log.close(clean=False)
        else:
            self._track(store)
        return found

    def _track(self, store: LogQueueStore | LogStream) -> None:
        """From now on the store tells when it has something to flush; and it may already
        (recovery cut a tail, say)."""
        store.log.changed = functools.partial(self._changed, store)
        self._changed(store)

    def _changed(self, store: LogQueueStore | LogStream) -> None:
        # Called on every append: a store already marked needs no lock. Only ``begin_flush``
        # (on the thread that appends) takes stores out, so one seen marked stays so.
        if store in self._dirty:
            return
        with self._lock:
            self._dirty[store] = None

    def _stores(self) -> list[LogQueueStore | LogStream]:
        with self._lock:
            return [*self._queues.values(), *self._streams.values()]

    def _directory(self, vhost: str, queue: str) -> Path:
        directory = self.root / _queue_dir_name(vhost, queue)
        if not directory.is_dir():
            self.env.fs.mkdir(directory, exist_ok=True)
        self._created(directory, vhost, queue)
        return directory

    def _created(self, directory: Path, vhost: str, queue: str) -> None:
        """A store's directory exists: it names its queue. Its entry in ``log/`` is durable
        only once ``log/`` is fsync'd, or a power cut could lose the queue with every message
        confirmed in it: not now, but by the next flush that syncs anything, once for every
        queue created since (a definitions import of 10,000 queues paid an fsync each). Until
        something in it is confirmed the directory holds nothing to lose: the queue's existence
        is the definitions file's, and a start recreates a directory lost to a power cut."""
        names = directory / "queue.cbor"
        if not names.exists():
            self.env.fs.write_file(names, cbor2.dumps({"vhost": vhost, "queue": queue}))
            with self._lock:
                self._unsynced_dirs.add(self.root)

    def _log(self, directory: Path, segment_bytes: int, *, lazy: bool = False) -> Log:
        return Log(
            directory,
            segment_bytes=segment_bytes,
            index_interval_bytes=self.index_interval_bytes,
            cache=self.cache,
            env=self.env,
            lazy=lazy,
        )

    def delete_queue(self, vhost: str, queue: str) -> None:
        """Move the queue's directory to the trash at once; the next flush makes that durable
        (a queue redeclared after it never sees the old messages) and removes it. An
        ``OSError`` leaves the queue as it was, open. A flush in
        flight for the old queue writes nothing more (its store is abandoned under its flush
        lock: ``LogFlush.abandon``)."""
        with self._lock:
            store: LogQueueStore | LogStream | None = self._queues.get((vhost, queue))
            if store is None:
                store = self._streams.get((vhost, queue))
        directory = self.root / _queue_dir_name(vhost, queue)
        if store is None and not directory.exists():
            return
        trash = self.root / ".trash"
        self.env.fs.mkdir(trash, exist_ok=True)  # OSError (e.g. no descriptors): nothing changed
        target = trash / uuid.uuid4().hex
        if store is not None:
            store.abandon(target)  # OSError: nothing changed
        else:
            self.env.fs.rename(directory, target)
        with self._lock:
            if store is not None:
                self._queues.pop((vhost, queue), None)
                self._streams.pop((vhost, queue), None)
                self._abandoned.append(store)
            self._trash.append(target)

    @property
    def needs_flush(self) -> bool:
        return bool(self._trash or self._abandoned or self._dirty)

    @property
    def healthy(self) -> bool:
        return self._healthy

    def _take_changed(self) -> dict[LogQueueStore | LogStream, None]:
        """The stores that said they changed since the last flush (and forget them)."""
        with self._lock:
            dirty, self._dirty = self._dirty, {}
        return dirty

    def begin_flush(self) -> Callable[[], None] | None:
        dirty = self._take_changed()
        stores = [store for store in dirty if not store.flush.abandoned]
        if self._sync_failed or any(store.log.sync_failed for store in stores):
            self._sync_failed = True
            self._healthy = False

            def refuse() -> None:
                raise OSError(
                    "an fdatasync of the log failed earlier; durable writes are refused until "
                    "the broker restarts (recovery then rescans the logs)"
                )

            return refuse
        works: list[Callable[[], None]] = []
        write_error: OSError | None = None
        now = time.monotonic()
        every = self._fsync_every
        fsync = every is not None and now - self._last_fsync >= every
        if fsync:
            self._last_fsync = now
        for store in stores:
            try:
                work = store.begin_flush(fsync=fsync)
            except OSError as exc:  # this store could not write; the others still flush
                write_error = write_error or exc
                self._changed(store)
                continue
            if work is not None:
                works.append(work)
            if store.needs_flush:  # left for a later flush (an fsync the policy defers)
                self._changed(store)
        if write_error is not None:
            self._healthy = False
            log.error("log backend: write failed: %s", write_error)
        with self._lock:
            trash, self._trash = self._trash, []
            abandoned, self._abandoned = self._abandoned, []
        if not works and not trash and not abandoned and write_error is None:
            return None  # new directories' entries wait for a flush that syncs something
        with self._lock:
            unsynced, self._unsynced_dirs = self._unsynced_dirs, set()
        if trash:
            unsynced.discard(self.root)  # the trash's sync below covers it

        def flush() -> None:
            try:
                for directory in sorted(unsynced):  # the data directory before log/
                    self.env.fsync_dir(directory)
                if trash:
                    self.env.fsync_dir(self.root)  # the deletes' renames, durable
                for work in works:
                    work()
            except OSError as exc:
                self._healthy = False
                with self._lock:
                    self._unsynced_dirs |= unsynced
                    self._trash.extend(trash)
                    self._abandoned.extend(abandoned)
                    for store in stores:  # each tries again (or refuses: ``sync_failed``)
                        self._dirty[store] = None
                self._sync_failed = any(store.log.sync_failed for store in stores)
                log.error("log backend: flush failed: %s", exc)
                raise
            for store in stores:  # its work may have left more (deleted segments' entries)
                if store.needs_flush:
                    self._changed(store)
            for store in abandoned:  # no flush of theirs is in flight any more
                store.close_abandoned()
            for path in trash:
                self.env.fs.rmtree(path)
            if write_error is not None:
                raise write_error
            self._healthy = True

        return flush

    def _sync_new_dirs(self) -> None:
        """Make the new directories' entries durable now (``OSError``: they stay due)."""
        with self._lock:
            unsynced, self._unsynced_dirs = self._unsynced_dirs, set()
        try:
            for directory in sorted(unsynced):  # the data directory before log/
                self.env.fsync_dir(directory)
        except OSError:
            with self._lock:
                self._unsynced_dirs |= unsynced
            raise

    def close(self) -> None:
        self._sync_new_dirs()
        for abandoned in self._abandoned:
            abandoned.close_abandoned()
        self._abandoned.clear()
        if self._trash:  # deletes since the last flush: durable now, and gone
            self.env.fsync_dir(self.root)
            for path in self._trash:
                self.env.fs.rmtree(path)
            self._trash.clear()
        for store in self._stores():
            try:
                store.close()
            except OSError as exc:  # that queue recovers uncleanly next time; close the rest
                log.error("log backend: closing %s failed: %s", store.directory, exc)
        with self._lock:
            self._queues.clear()
            self._streams.clear()
