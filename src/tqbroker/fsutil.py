"""Durable file operations shared by everything that writes metadata, on the facade ``fsio.fs``.

Responsibilities:
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

from . import filecache, fsio


def _shedding(operation: Callable[[], None]) -> None:
    try:
        operation()
    except OSError as exc:
        if exc.errno not in filecache.OUT_OF_DESCRIPTORS or not filecache.files.shed():
            raise
        operation()


def fsync_dir(path: Path) -> None:
    _shedding(lambda: fsio.fs.fsync_dir(path))


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each followed by an fsync of its parent, so
    that a power cut cannot lose a new directory's entry (and with it everything later made
    durable inside it). Directories that exist are left as they are."""
    if path.is_dir():
        return
    parent = path.parent
    if parent != path:
        make_dirs(parent)
    try:
        fsio.fs.mkdir(path)
    except FileExistsError:
        if path.is_dir():
            return  # created meanwhile, by someone who syncs it
        raise
    fsio.fs.fsync_dir(parent)


def atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; with ``fsync`` also durably. Without
    ``fsync`` a power loss may keep the rename but not the bytes (an empty or partial file):
    only for a file whose loss is survivable."""
    _shedding(lambda: _atomic_write(path, data, fsync=fsync))


def _atomic_write(path: Path, data: bytes, *, fsync: bool) -> None:
    fs = fsio.fs
    tmp = path.with_name(path.name + ".tmp")
    fs.write_file(tmp, data, fsync=fsync)
    fs.replace(tmp, path)
    if fsync:
        fs.fsync_dir(path.parent)
