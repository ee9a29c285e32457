"""Kafka-compatible key partitioning for tqbroker: the ``x-key-partition`` exchange type.

Responsibilities:
- ``murmur2`` and ``partition_for``: Kafka's partitioner (``Utils.murmur2``, seed 0x9747b28c,
  ``toPositive(hash) % partitions``), bit for bit;
- ``KeyPartitionRouter``: bindings keyed by partition number; a message goes to the partition of
  its key (the ``x-partition-key`` header, else the routing key), or round-robin when the key is
  empty.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from itertools import count
from typing import Final

from tqbroker.plugins import FieldTable

SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the 32-bit MurmurHash2 of ``data``, as a signed int."""
    length = len(data)
    h = (SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class KeyPartitionRouter:
    # Not memoisable: the ``x-partition-key`` header overrides the routing key, and an empty key
    # goes round-robin (a different partition each call).
    cacheable = False

    def __init__(self) -> None:
        self._partitions: dict[int, Counter[Hashable]] = {}
        self._next = count()

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        if not binding_key.isascii() or not binding_key.isdigit():
            raise ValueError(
                f"x-key-partition binding keys are partition numbers (0, 1, ...), not "
                f"{binding_key!r}"
            )
        self._partitions.setdefault(int(binding_key), Counter())[destination] += 1

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        partition = int(binding_key)
        destinations = self._partitions.get(partition)
        if destinations is None:
            return
        destinations[destination] -= 1
        if destinations[destination] <= 0:
            del destinations[destination]
        if not destinations:
            del self._partitions[partition]

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        if not self._partitions:
            return ()
        partitions = max(self._partitions) + 1
        key = headers.get("x-partition-key") if headers else None
        if isinstance(key, str):
            key = key.encode()
        if not isinstance(key, bytes):
            key = routing_key.encode()
        if not key:  # no key: round-robin, as Kafka's producer spreads unkeyed records
            return self._partitions.get(next(self._next) % partitions, ())
        return self._partitions.get(partition_for(key, partitions), ())


class KeyPartitionExchange:
    def validate(self, arguments: FieldTable) -> None:
        pass

    def create_router(self, arguments: FieldTable) -> KeyPartitionRouter:
        return KeyPartitionRouter()


__all__ = ["KeyPartitionExchange", "KeyPartitionRouter", "murmur2", "partition_for"]
