"""Durable file operations shared by everything that writes metadata, on the facade ``fsio.fs``.

Responsibilities:
- ``fsync_dir``: make a directory's entries (creates, renames, unlinks) durable;
- ``atomic_write``: replace a file so that a crash leaves either the old or the new content:
  write a temporary file, fsync it, rename it over the target, fsync the directory.
"""

from __future__ import annotations

from pathlib import Path

from . import fsio


def fsync_dir(path: Path) -> None:
    fsio.fs.fsync_dir(path)


def atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; with ``fsync`` also durably. Without
    ``fsync`` a power loss may keep the rename but not the bytes (an empty or partial file):
    only for a file whose loss is survivable."""
    fs = fsio.fs
    tmp = path.with_name(path.name + ".tmp")
    fs.write_file(tmp, data, fsync=fsync)
    fs.replace(tmp, path)
    if fsync:
        fs.fsync_dir(path.parent)
