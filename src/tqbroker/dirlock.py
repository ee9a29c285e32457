"""One broker per data directory: an exclusive ``flock`` on ``tqbroker.lock`` in it.

Responsibilities:
- ``DataDirLock(path)``: take the lock (without waiting) or raise ``DataDirInUse`` naming the
  directory and the PID written by the holder; while held, the file holds this process's PID;
- the lock lives as long as its open file description: ``release()`` (or the process's exit,
  kill -9 included) frees it, so a file left by a killed broker never blocks a restart. Two
  locks taken in one process on one directory conflict as well (two ``open`` calls are two
  open file descriptions);
- a refused process changes nothing in the directory (the file is opened, never written, unless
  the lock is held). A clean ``release()`` empties the file again, so a directory a broker has
  stopped using reads as it did before it started.

The lock is advisory and local: a data directory on a network file system that does not
implement ``flock`` across machines is not protected against a broker on another machine.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = "tqbroker.lock"
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


class DataDirInUse(Exception):
    """Another broker (``pid``, None if it has not written it yet) holds the data directory."""

    def __init__(self, path: Path, pid: int | None) -> None:
        if pid is None:
            holder = "another broker (its PID not written yet)"
        elif pid == os.getpid():
            holder = f"another broker in this process (PID {pid})"
        else:
            holder = f"another broker (PID {pid})"
        super().__init__(
            f"the data directory {path} is in use by {holder}; "
            "each broker needs a data directory of its own"
        )
        self.path, self.pid = path, pid


class DataDirLock:
    """The exclusive lock on ``path`` (an existing directory), taken by the constructor."""

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUse(self.path, holder) from None
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                os.close(fd)
                raise
            # A full disk: the lock is held all the same (its PID is only a courtesy), and
            # the start goes on to say what cannot be written.
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empty the file (the PID is no longer true) and free the lock; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass  # the lock goes all the same: a stale PID never blocks a start
        finally:
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
