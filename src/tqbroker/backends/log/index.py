"""A sparse index file of a log segment: the offset index and the time index are both one.

Responsibilities: entries ``(key, value)`` with strictly increasing keys, kept in memory as two
arrays (``keys``, ``values``: bisected by readers), appended to a buffer and written to the
index file with one ``pwrite`` (``write_out``), fsync'd on demand (``sync``); loading the file
back (``load``, which refuses a file that is not a valid index); rewriting it from scratch
(``clear``, the entries found again, ``rewrite``). Entry layouts: ``format.INDEX_ENTRY`` (offset
index: relative offset -> file position), ``format.TIME_ENTRY`` (time index: greatest timestamp
so far -> relative offset).
"""

from __future__ import annotations

import logging
import struct
from array import array
from bisect import bisect_right
from pathlib import Path

from ...storage_env.filecache import CachedFile

log = logging.getLogger(__name__)


class SparseIndex:
    """One index file of a segment (its descriptor from the file-handle cache)."""

    __slots__ = (
        "_buffer",
        "_entry",
        "_key_type",
        "_value_type",
        "_written",
        "file",
        "keys",
        "values",
    )

    def __init__(
        self, file: CachedFile, entry: struct.Struct, key_type: str, value_type: str
    ) -> None:
        self.file = file
        self._entry = entry
        self._key_type = key_type
        self._value_type = value_type
        self.keys = array(key_type)
        self.values = array(value_type)
        self._buffer = bytearray()
        self._written = 0  # bytes of entries in the file

    def append(self, key: int, value: int) -> None:
        """Add an entry (its key above every key so far); written out by ``write_out``."""
        self.keys.append(key)
        self.values.append(value)
        self._buffer += self._entry.pack(key, value)

    def find(self, key: int) -> int:
        """The index of the last entry whose key is at or below ``key`` (-1: none)."""
        return bisect_right(self.keys, key) - 1

    def write_out(self) -> bool:
        """Write the buffered entries to the file (page cache, no fsync); return whether there
        were any."""
        if not self._buffer:
            return False
        self._written += self.file.pwrite(bytes(self._buffer), self._written)
        self._buffer.clear()
        return True

    def sync(self) -> None:
        self.file.fdatasync()

    def load(self, value_limit: int | None = None) -> bool:
        """Read the entries back from the file; False (the index left as it was) if it is not a
        valid index: a partial entry, keys not strictly increasing, or (with ``value_limit``) a
        value at or above it."""
        raw = self.file.pread(self.file.size(), 0)
        if len(raw) % self._entry.size:
            return False
        keys, values = array(self._key_type), array(self._value_type)
        for key, value in self._entry.iter_unpack(raw):
            if (keys and key <= keys[-1]) or (value_limit is not None and value >= value_limit):
                return False
            keys.append(key)
            values.append(value)
        self.keys, self.values = keys, values
        self._written = len(raw)
        return True

    def clear(self) -> None:
        """Forget every entry in memory (the file is left alone until ``rewrite``)."""
        self.keys, self.values = array(self._key_type), array(self._value_type)
        self._buffer.clear()

    def rewrite(self) -> None:
        """Empty the file: every entry in memory is written again by the next ``write_out``."""
        self.file.ftruncate(0)
        self._written = 0
        entries = zip(self.keys, self.values, strict=True)
        self._buffer[:] = b"".join(self._entry.pack(key, value) for key, value in entries)

    @property
    def path(self) -> Path:
        return self.file.path
