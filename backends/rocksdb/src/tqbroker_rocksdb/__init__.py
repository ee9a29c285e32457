"""A durable tqbroker storage backend on RocksDB (through rocksdict).

Registered under the entry-point group ``tqbroker.backends`` as ``rocksdb``. The design (key
layout, flushes, delivery reservations) is in docs/storage-format.md, "RocksDB backend".
"""

from __future__ import annotations

from .backend import RocksDBBackend
from .store import RocksDBQueueStore

__all__ = ["RocksDBBackend", "RocksDBQueueStore"]
