"""A recording ``FileSystem`` (for a broker's ``StorageEnv``): does every operation on the real
disk and records each mutating one under a data directory (with its bytes), plus the workload's
marks ("confirmed up to here").

Files and directories are named in the trace by a model id (the data directory is 0), given
when they are created, so that a directory renamed while files in it are open (a queue moved to
the trash) keeps its files. Real inode numbers map to model ids; an operation on anything
outside the data directory is not recorded.

Trace operations (tuples):
``("create", dir, name, id, kind)`` kind "f" or "d"; ``("write", id, offset, data)``;
``("trunc", id, size)``; ``("fsync", id)`` a file's data durable; ``("dsync", id)`` a
directory's entries durable; ``("rename", src_dir, src_name, dst_dir, dst_name)``;
``("unlink", dir, name)`` (a file, an empty directory or a whole tree); ``("mark", payload)``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from tqbroker.storage_env.fsio import Buffer, FileSystem, StrPath

Op = tuple[Any, ...]


class Recorder(FileSystem):
    def __init__(self, root: Path, *, sync_delay: float = 0.0, adopt: bool = False) -> None:
        """Record under ``root``: empty, or with ``adopt`` whatever it holds, as if created
        and synced by the first operations of the trace (a crash state that recovery runs on,
        for a second crash)."""
        assert adopt or not any(root.iterdir()), "recording starts on an empty data directory"
        self.root = root
        self.ops: list[Op] = []
        self._ids: dict[int, int] = {os.stat(root).st_ino: 0}
        self._next = 1
        if adopt:
            self._adopt(root, 0)
        self.adopted = len(self.ops)  # the trace's first operations: the starting state
        self._lock = threading.RLock()
        # Seconds each fsync takes at least (a slow disk): widens the window between a write
        # and its fsync, so that a promise made too early lands before the fsync in the trace.
        self.sync_delay = sync_delay

    def _adopt(self, directory: Path, ident: int) -> None:
        for path in sorted(directory.iterdir()):
            child = self._new(os.lstat(path).st_ino)
            if path.is_dir():
                self.ops.append(("create", ident, path.name, child, "d"))
                self._adopt(path, child)
            else:
                self.ops.append(("create", ident, path.name, child, "f"))
                data = path.read_bytes()
                if data:
                    self.ops.append(("write", child, 0, data))
                self.ops.append(("fsync", child))
        self.ops.append(("dsync", ident))

    # -- helpers -----------------------------------------------------------------------------

    def mark(self, **payload: Any) -> None:
        """What the workload was promised by now (appended in order with the operations)."""
        with self._lock:
            self.ops.append(("mark", payload))

    def _entry(self, path: StrPath) -> tuple[int, str] | None:
        """(model id of the parent directory, name), or None outside the data directory."""
        parent, name = os.path.split(os.path.abspath(path))
        try:
            ino = os.stat(parent).st_ino
        except FileNotFoundError:
            return None
        found = self._ids.get(ino)
        return None if found is None else (found, name)

    def _fd_id(self, fd: int) -> tuple[int | None, bool]:
        st = os.fstat(fd)
        return self._ids.get(st.st_ino), stat.S_ISDIR(st.st_mode)

    def _new(self, ino: int) -> int:
        self._ids[ino] = ident = self._next
        self._next += 1
        return ident

    def _forget_tree(self, path: StrPath) -> None:
        try:
            self._ids.pop(os.lstat(path).st_ino, None)
        except FileNotFoundError:
            return
        if os.path.isdir(path) and not os.path.islink(path):
            for parent, dirs, files in os.walk(path):
                for name in dirs + files:
                    with contextlib.suppress(FileNotFoundError):
                        self._ids.pop(os.lstat(os.path.join(parent, name)).st_ino, None)

    # -- FileSystem --------------------------------------------------------------------------

    def open(self, path: StrPath, flags: int, mode: int = 0o777) -> int:
        with self._lock:
            existed = os.path.lexists(path)
            fd = os.open(path, flags, mode)
            entry = self._entry(path)
            if entry is None:
                return fd
            st = os.fstat(fd)
            if not existed and flags & os.O_CREAT:
                ident = self._new(st.st_ino)
                self.ops.append(("create", *entry, ident, "f"))
            elif existed and flags & os.O_TRUNC and st.st_ino in self._ids:
                self.ops.append(("trunc", self._ids[st.st_ino], 0))
            return fd

    def pwrite(self, fd: int, data: Buffer, offset: int) -> int:
        with self._lock:
            n = os.pwrite(fd, data, offset)
            ident, _ = self._fd_id(fd)
            if ident is not None and n:
                self.ops.append(("write", ident, offset, bytes(memoryview(data)[:n])))
            return n

    def ftruncate(self, fd: int, length: int) -> None:
        with self._lock:
            os.ftruncate(fd, length)
            ident, _ = self._fd_id(fd)
            if ident is not None:
                self.ops.append(("trunc", ident, length))

    def _sync(self, fd: int, real: Any) -> None:
        if self.sync_delay:
            time.sleep(self.sync_delay)
        with self._lock:
            real(fd)
            ident, is_dir = self._fd_id(fd)
            if ident is not None:
                self.ops.append(("dsync" if is_dir else "fsync", ident))

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, os.fdatasync)

    def fsync(self, fd: int) -> None:
        self._sync(fd, os.fsync)

    def _move(self, source: StrPath, target: StrPath, real: Any) -> None:
        with self._lock:
            src, dst = self._entry(source), self._entry(target)
            if os.path.lexists(target):
                self._forget_tree(target)
            real(source, target)
            if src is not None and dst is not None:
                self.ops.append(("rename", *src, *dst))
            elif src is not None:  # moved out of the data directory: gone from it
                self.ops.append(("unlink", *src))

    def rename(self, source: StrPath, target: StrPath) -> None:
        self._move(source, target, os.rename)

    def replace(self, source: StrPath, target: StrPath) -> None:
        self._move(source, target, os.replace)

    def _remove(self, path: StrPath, real: Any) -> None:
        with self._lock:
            entry = self._entry(path)
            if entry is not None:
                self._forget_tree(path)
            real(path)
            if entry is not None and not os.path.lexists(path):
                self.ops.append(("unlink", *entry))

    def rmdir(self, path: StrPath) -> None:
        self._remove(path, os.rmdir)

    def unlink(self, path: StrPath, *, missing_ok: bool = False) -> None:
        if missing_ok and not os.path.lexists(path):
            return
        self._remove(path, os.unlink)

    def rmtree(self, path: StrPath) -> None:
        if os.path.lexists(path):
            self._remove(path, super().rmtree)

    def mkdir(self, path: Path, *, parents: bool = False, exist_ok: bool = False) -> None:
        with self._lock:
            if parents and not path.parent.exists():
                self.mkdir(path.parent, parents=True, exist_ok=True)
            try:
                os.mkdir(path)
            except FileExistsError:
                if not exist_ok:
                    raise
                return
            entry = self._entry(path)
            if entry is not None:
                ident = self._new(os.stat(path).st_ino)
                self.ops.append(("create", *entry, ident, "d"))
