"""A broker's storage environment: the file system its storage writes through (``fsio``) and
the file-handle cache its log files share (``filecache``), passed to what it opens, never a
process global (two brokers in one process, each on a recording disk of its own, are
independent).

``StorageEnv`` also does the durable file operations shared by everything that writes
metadata:
- ``fsync_dir``: make a directory's entries (creates, renames, unlinks) durable;
- ``make_dirs``: create a directory and its missing parents durably (each new entry fsync'd);
- ``atomic_write``: replace a file so that a crash leaves either the old or the new content:
  write a temporary file, fsync it, rename it over the target, fsync the directory.

Out of descriptors (EMFILE, ENFILE), each closes idle descriptors of the file-handle cache and
tries once more: the broker's own files come before the cache's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from .filecache import OUT_OF_DESCRIPTORS, FileCache
from .fsio import FileSystem

__all__ = ["FileCache", "FileSystem", "StorageEnv"]


@attrs.frozen
class StorageEnv:
    """The file system (``fs``) and the file-handle cache (``files``, on the same ``fs``)."""

    fs: FileSystem
    files: FileCache

    @classmethod
    def default(cls, fs: FileSystem | None = None, *, file_limit: int | None = None) -> StorageEnv:
        """A new environment on ``fs`` (the real file system if None) with a cache of its own
        (``file_limit`` descriptors; None: a share of the process's limit)."""
        fs = FileSystem() if fs is None else fs
        return cls(fs, FileCache(fs, file_limit))

    def fsync_dir(self, path: Path) -> None:
        self._shedding(lambda: self.fs.fsync_dir(path))

    def make_dirs(self, path: Path) -> None:
        """Create ``path`` and its missing parents, each followed by an fsync of its parent, so
        that a power cut cannot lose a new directory's entry (and with it everything later made
        durable inside it). Directories that exist are left as they are."""
        if path.is_dir():
            return
        parent = path.parent
        if parent != path:
            self.make_dirs(parent)
        try:
            self.fs.mkdir(path)
        except FileExistsError:
            if path.is_dir():
                return  # created meanwhile, by someone who syncs it
            raise
        self.fs.fsync_dir(parent)

    def atomic_write(self, path: Path, data: bytes, *, fsync: bool = True) -> None:
        """Replace ``path`` with ``data`` atomically; with ``fsync`` also durably. Without
        ``fsync`` a power loss may keep the rename but not the bytes (an empty or partial
        file): only for a file whose loss is survivable."""
        self._shedding(lambda: self._atomic_write(path, data, fsync=fsync))

    def _atomic_write(self, path: Path, data: bytes, *, fsync: bool) -> None:
        fs = self.fs
        tmp = path.with_name(path.name + ".tmp")
        fs.write_file(tmp, data, fsync=fsync)
        fs.replace(tmp, path)
        if fsync:
            fs.fsync_dir(path.parent)

    def _shedding(self, operation: Callable[[], None]) -> None:
        try:
            operation()
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS or not self.files.shed():
                raise
            operation()
