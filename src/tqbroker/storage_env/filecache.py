"""The file-handle cache: every file of a broker's log backend shares one bounded set of
descriptors.

A log segment is three files; kept open for the segment's life, 100k durable queues would need
300k descriptors. As RabbitMQ's ``file_handle_cache`` and PostgreSQL's virtual file descriptors
do, each file is a ``CachedFile`` whose descriptor is opened on use and closed again, least
recently used first, once the cache holds more than its limit.

Rules:
- every operation (``pread``, ``pwrite``, ``fdatasync``...) pins the descriptor while it runs,
  from whatever thread: a descriptor in use (by the flusher's worker thread, say) is never closed
  under it. ``hold`` pins a file until ``close``: one about to be unlinked or renamed over, that
  a reader or a flush in flight may still use, keeps the file it had;
- a file is reopened by name in its ``Directory``; ``move`` renames a directory (``move_file`` a
  file) and repoints its files at once, under the cache's lock, so a reopen never meets a name
  half moved;
- closing a descriptor with unsynced writes loses nothing: on Linux an fdatasync through any
  descriptor of a file writes back every dirty page of it. (A write-back error meanwhile is
  reported to the next fsync through a descriptor opened since, from Linux 4.16 on, unless the
  kernel dropped the inode in between: PostgreSQL's descriptor cache has the same window.);
- the limit: a quarter of the process's descriptor limit (``RLIMIT_NOFILE``, read at each
  open), at least 64, or set by the owner; the rest stay for connections and the broker's own
  files. Out of descriptors all the same (EMFILE, ENFILE), an open first closes idle
  descriptors and tries again (``shed`` does that for callers opening files of their own).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import resource
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Final

from .fsio import Buffer, FileSystem

log = logging.getLogger(__name__)

MIN_LIMIT: Final = 64
# The share of the process's descriptor limit the cache may hold open.
LIMIT_FRACTION: Final = 0.25
OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})


class Directory:
    """A directory whose files may be reopened by name; ``FileCache.move`` renames it."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"Directory({str(self.path)!r})"


class CachedFile:
    """A file opened on demand through the cache, read and written by position."""

    __slots__ = ("_cache", "_closed", "_fd", "_held", "_pins", "directory", "name")

    def __init__(self, cache: FileCache, directory: Directory, name: str) -> None:
        self._cache = cache
        self.directory = directory
        self.name = name
        self._fd = -1  # -1: not open now
        self._pins = 0
        self._held = False
        self._closed = False

    @property
    def path(self) -> Path:
        return self.directory.path / self.name

    @property
    def is_open(self) -> bool:
        """Whether the file has a descriptor now (not evicted)."""
        return self._fd >= 0

    def pread(self, size: int, position: int) -> bytes:
        fd = self._cache.acquire(self)
        try:
            return os.pread(fd, size, position)
        finally:
            self._cache.release(self)

    def pwrite(self, data: Buffer, position: int) -> int:
        fd = self._cache.acquire(self)
        try:
            return self._cache.fs.pwrite(fd, data, position)
        finally:
            self._cache.release(self)

    def ftruncate(self, length: int) -> None:
        fd = self._cache.acquire(self)
        try:
            self._cache.fs.ftruncate(fd, length)
        finally:
            self._cache.release(self)

    def fdatasync(self) -> None:
        fd = self._cache.acquire(self)
        try:
            self._cache.fs.fdatasync(fd)
        finally:
            self._cache.release(self)

    def size(self) -> int:
        fd = self._cache.acquire(self)
        try:
            return os.fstat(fd).st_size
        finally:
            self._cache.release(self)

    def map(self, length: int) -> mmap.mmap:
        """A read-only map of the first ``length`` bytes (it keeps a descriptor of its own)."""
        fd = self._cache.acquire(self)
        try:
            return mmap.mmap(fd, length, access=mmap.ACCESS_READ)
        finally:
            self._cache.release(self)

    def hold(self) -> None:
        """Keep the descriptor open until ``close`` (opening it if it was closed): the name
        may stop naming this file (an unlink, a rename over it) while it is still used."""
        if not self._held:
            self._cache.acquire(self)
            self._held = True

    def close(self) -> None:
        """Close the descriptor now, or when the operation in flight on it ends; any later
        use raises ``ValueError``."""
        self._cache.close(self)


class FileCache:
    """A bounded LRU of open descriptors (thread-safe)."""

    def __init__(self, fs: FileSystem, limit: int | None = None) -> None:
        self.fs = fs  # opens, writes, syncs, renames and closes go through it
        self.limit = limit  # None: ``LIMIT_FRACTION`` of RLIMIT_NOFILE
        self._lock = threading.Lock()
        self._idle: OrderedDict[CachedFile, None] = OrderedDict()  # least recently used first
        self.open_count = 0
        self.opens = 0  # descriptors opened so far (reopens included)

    def file(self, directory: Directory, name: str, *, create: bool = True) -> CachedFile:
        """The file ``name`` in ``directory``; with ``create`` it is created now if missing
        (an ``OSError`` then: no file, no descriptor left behind)."""
        file = CachedFile(self, directory, name)
        if create:
            with self._lock:
                file._fd = self._open(file.path, os.O_RDWR | os.O_CREAT)
                self._idle[file] = None
        return file

    def create(self, file: CachedFile) -> None:
        """Create a file ``file(create=False)`` gave (if missing) and open it: until then it
        has no descriptor and any use of it fails, as with a file removed meanwhile."""
        with self._lock:
            if file._closed:
                raise ValueError(f"{file.path} is closed")
            if file._fd < 0:
                file._fd = self._open(file.path, os.O_RDWR | os.O_CREAT)
                if file._pins == 0:
                    self._idle[file] = None

    def current_limit(self) -> int:
        if self.limit is not None:
            return max(self.limit, 1)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        return max(MIN_LIMIT, int(soft * LIMIT_FRACTION))

    # -- pinning (any thread) ----------------------------------------------------------------

    def acquire(self, file: CachedFile) -> int:
        with self._lock:
            if file._closed:
                raise ValueError(f"{file.path} is closed")
            if file._fd < 0:
                file._fd = self._open(file.path, os.O_RDWR)
            elif file._pins == 0:
                del self._idle[file]
            file._pins += 1
            return file._fd

    def release(self, file: CachedFile) -> None:
        with self._lock:
            file._pins -= 1
            if file._pins == 0:
                if file._closed:
                    self._close_fd(file)
                else:
                    self._idle[file] = None

    def close(self, file: CachedFile) -> None:
        with self._lock:
            if file._closed:
                return
            file._closed = True
            if file._held:
                file._held = False
                file._pins -= 1
            if file._pins == 0 and file._fd >= 0:
                self._idle.pop(file, None)  # not there if it was held
                self._close_fd(file)

    # -- renaming ----------------------------------------------------------------------------

    def move(self, directory: Directory, target: Path) -> None:
        """Rename ``directory`` to ``target``; its files reopen there from now on."""
        with self._lock:
            self.fs.rename(directory.path, target)
            directory.path = target

    def move_file(self, file: CachedFile, directory: Directory) -> None:
        """Rename ``file`` into ``directory``, over any file of its name there."""
        with self._lock:
            self.fs.replace(file.path, directory.path / file.name)
            file.directory = directory

    # -- descriptors -------------------------------------------------------------------------

    def shed(self, fraction: float = 0.25) -> int:
        """Close that share of the idle descriptors (at least one if any), oldest first, for
        an open that met EMFILE; returns how many were closed."""
        with self._lock:
            return self._evict(max(1, int(len(self._idle) * fraction)) if self._idle else 0)

    def _open(self, path: Path, flags: int) -> int:
        """Open ``path`` (under the lock), making room first."""
        excess = self.open_count + 1 - self.current_limit()
        if excess > 0:
            self._evict(excess)
        try:
            fd = self.fs.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS or not self._evict(max(1, len(self._idle) // 4)):
                raise
            fd = self.fs.open(path, flags, 0o644)
        self.open_count += 1
        self.opens += 1
        return fd

    def _evict(self, count: int) -> int:
        closed = 0
        while closed < count and self._idle:
            file, _ = self._idle.popitem(last=False)
            self._close_fd(file)
            closed += 1
        return closed

    def _close_fd(self, file: CachedFile) -> None:
        fd, file._fd = file._fd, -1
        self.open_count -= 1
        try:
            self.fs.close(fd)
        except OSError as exc:  # the descriptor is gone all the same
            log.warning("closing %s: %s", file.path, exc)
