"""The file-system facade: the storage code (the ``log`` backend, the definitions file, the
users file) does every durable file operation through its ``StorageEnv``'s ``fs``.

Responsibilities:
- ``FileSystem``: the real implementation, thin wrappers of ``os`` functions (one call frame
  each; the hot path calls them once per flush, not per message): ``open`` (with ``O_CREAT``:
  a create), ``pwrite``, ``ftruncate``, ``fdatasync``/``fsync``, ``close``,
  ``rename``/``replace``, ``unlink``, ``mkdir``, ``rmdir``, ``rmtree`` (ignoring errors),
  ``fsync_dir`` (a directory's entries durable) and ``write_file`` (create or truncate, write,
  optionally fsync);
- another implementation (the power-cut simulation in ``tests/powercut/`` records every
  mutating operation through one) is given to a broker in its ``StorageEnv``.

Reads (``pread``, ``fstat``, ``mmap``, ``read_bytes``) go to ``os`` directly: they change
nothing on disk.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

StrPath = str | os.PathLike[str]
Buffer = bytes | bytearray | memoryview


class FileSystem:
    """The real file system."""

    # Each looks its ``os`` function up at the call, so that a test's monkeypatched
    # ``os.fdatasync`` (or ``os.replace``, ...) still sees every call.

    def open(self, path: StrPath, flags: int, mode: int = 0o777) -> int:
        return os.open(path, flags, mode)

    def pwrite(self, fd: int, data: Buffer, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, source: StrPath, target: StrPath) -> None:
        os.rename(source, target)

    def replace(self, source: StrPath, target: StrPath) -> None:
        os.replace(source, target)

    def rmdir(self, path: StrPath) -> None:
        os.rmdir(path)

    def unlink(self, path: StrPath, *, missing_ok: bool = False) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, path: Path, *, parents: bool = False, exist_ok: bool = False) -> None:
        path.mkdir(parents=parents, exist_ok=exist_ok)

    def rmtree(self, path: StrPath) -> None:
        """Remove a directory tree, ignoring errors (what is left is removed another time)."""
        shutil.rmtree(path, ignore_errors=True)

    def fsync_dir(self, path: StrPath) -> None:
        """Make a directory's entries (creates, renames, unlinks) durable."""
        fd = self.open(path, os.O_RDONLY)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)

    def write_file(self, path: StrPath, data: bytes, *, fsync: bool = False) -> None:
        """Create or truncate ``path`` and write ``data`` (not atomic: see
        ``StorageEnv.atomic_write``); with ``fsync`` the content is durable (not the entry)."""
        fd = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += self.pwrite(fd, view[written:], written)
            if fsync:
                self.fsync(fd)
        finally:
            self.close(fd)
