"""The record cache: the most recently appended frames of every log of a backend, in memory, so
that a consumer keeping up with publishers is not served from disk (``RecordCache``)."""

from __future__ import annotations

from array import array
from collections import deque
from itertools import repeat


class RecordCache:
    """The most recently appended records of every log of a backend, bounded by bytes and
    evicted oldest first, so that a consumer keeping up with publishers is served from memory
    instead of a read from the page cache. Only a log's active segment is served from it (older
    records are read from disk, checked). Each log registers for an id and a dict of its own
    entries.

    Built to cost the garbage collector nothing: a log's entries are ``offset -> frame bytes``
    (as written to the segment: a record, or the batch that holds the offset, under each of its
    offsets), a dict of atoms that CPython does not track, and the eviction order is an
    ``array``. A full collection then never walks the cache, however many records it
    holds (caching ``Message`` objects made full collections stall the broker for hundreds of
    milliseconds with a few hundred thousand records cached).

    Compaction never touches an active segment, so the cache never serves a record compaction
    removed."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._logs: dict[int, dict[int, bytes]] = {}
        # (log id, first offset, last offset, bytes charged), oldest first from
        # ``_order_start``.
        self._order = array("q")
        self._order_start = 0
        self._bytes = 0
        self._last_id = 0

    def register(self) -> tuple[int, dict[int, bytes]]:
        """A new log's id and the dict its cached records appear in (by offset)."""
        self._last_id += 1
        entries: dict[int, bytes] = {}
        self._logs[self._last_id] = entries
        return self._last_id, entries

    def unregister(self, log_id: int) -> None:
        """The log is closed: forget its records (their bytes are released as they age out)."""
        self._logs.pop(log_id, None)

    def put(self, log_id: int, offset: int, frame: bytes, last_offset: int | None = None) -> None:
        """Cache a frame: a record at ``offset``, or a batch from ``offset`` to
        ``last_offset``."""
        entries = self._logs.get(log_id)
        if entries is None:
            return
        last = offset if last_offset is None else last_offset
        size = len(frame) + 64 * (last - offset + 1)
        if last == offset:
            entries[offset] = frame
        else:
            entries.update(dict.fromkeys(range(offset, last + 1), frame))
        self._order.extend((log_id, offset, last, size))
        self._bytes += size
        order = self._order
        while self._bytes > self.max_bytes:
            i = self._order_start
            old_entries = self._logs.get(order[i])
            if old_entries is not None:
                first, last = order[i + 1], order[i + 2]
                # A C-level loop: a batch has thousands of records.
                deque(map(old_entries.pop, range(first, last + 1), repeat(None)), maxlen=0)
            self._bytes -= order[i + 3]
            self._order_start = i + 4
        if self._order_start > 4 * 65536 and 2 * self._order_start > len(order):
            del order[: self._order_start]  # compact now and then: amortised O(1) per record
            self._order_start = 0
