"""A durable tqbroker storage backend on RocksDB (through rocksdict).

Registered under the entry-point group ``tqbroker.backends`` as ``rocksdb``. See ``backend.py``
for the design (key layout, flushes, delivery reservations) and ``codec.py`` for the encodings.
"""

from __future__ import annotations

from .backend import RocksDBBackend, RocksDBQueueStore

__all__ = ["RocksDBBackend", "RocksDBQueueStore"]
