"""Durable file operations shared by everything that writes metadata.

Responsibilities:
- ``fsync_dir``: make a directory's entries (creates, renames, unlinks) durable;
- ``atomic_write``: replace a file so that a crash leaves either the old or the new content:
  write a temporary file, fsync it, rename it over the target, fsync the directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; with ``fsync`` also durably (else it may be
    lost, but never torn, by a power loss)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)
