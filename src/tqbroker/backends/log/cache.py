"""The record cache: the most recently appended frames of every log of a backend, in memory, so
that a consumer keeping up with publishers is not served from disk (``RecordCache``)."""

from __future__ import annotations

from array import array
from bisect import bisect_right


class RecordCache:
    """The most recently appended records of every log of a backend, bounded by bytes and
    evicted oldest first, so that a consumer keeping up with publishers is served from memory
    instead of a read from the page cache. Only a log's active segment is served from it (older
    records are read from disk, checked). Each log registers for an id and a dict of its own
    entries.

    Built to cost the garbage collector nothing: a log's frames are bytes as written to the
    segment, records in a dict of atoms (``offset -> frame``) that CPython does not track,
    batches in arrays (one entry a batch, however many records it holds), and the eviction
    order is an ``array``. A full collection then never walks the cache, however many
    records it holds (caching ``Message`` objects made full collections stall the broker for
    hundreds of milliseconds with a few hundred thousand records cached).

    Compaction never touches an active segment, so the cache never serves a record compaction
    removed."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._logs: dict[int, CachedFrames] = {}
        # (log id, first offset, last offset, bytes charged), oldest first from
        # ``_order_start``.
        self._order = array("q")
        self._order_start = 0
        self._bytes = 0
        self._last_id = 0

    def register(self) -> tuple[int, CachedFrames]:
        """A new log's id and where its cached frames appear."""
        self._last_id += 1
        frames = CachedFrames()
        self._logs[self._last_id] = frames
        return self._last_id, frames

    def unregister(self, log_id: int) -> None:
        """The log is closed: forget its records (their bytes are released as they age out)."""
        self._logs.pop(log_id, None)

    def put(self, log_id: int, offset: int, frame: bytes, last_offset: int | None = None) -> None:
        """Cache a frame: a record at ``offset``, or a batch from ``offset`` to
        ``last_offset``."""
        frames = self._logs.get(log_id)
        if frames is None:
            return
        last = offset if last_offset is None else last_offset
        size = len(frame) + 64 * (last - offset + 1)
        frames.add(offset, last, frame)
        self._order.extend((log_id, offset, last, size))
        self._bytes += size
        order = self._order
        while self._bytes > self.max_bytes:
            i = self._order_start
            old = self._logs.get(order[i])
            if old is not None:
                old.drop_oldest(order[i + 1], order[i + 2])
            self._bytes -= order[i + 3]
            self._order_start = i + 4
        if self._order_start > 4 * 65536 and 2 * self._order_start > len(order):
            del order[: self._order_start]  # compact now and then: amortised O(1) per record
            self._order_start = 0


class CachedFrames:
    """One log's cached frames: records by offset, and record batches in offset order (their
    first and last offsets in arrays); evicted oldest first."""

    __slots__ = ("_firsts", "_frames", "_lasts", "_start", "records")

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self._firsts = array("q")
        self._lasts = array("q")
        self._frames: list[bytes | None] = []
        self._start = 0  # the oldest batch kept

    def find(self, offset: int) -> bytes | None:
        """The cached frame that holds ``offset``: a record's or a batch's; None if none."""
        frame = self.records.get(offset)
        start = self._start
        if frame is not None or start == len(self._frames):
            return frame
        i = bisect_right(self._firsts, offset, start) - 1
        if i >= start and offset <= self._lasts[i]:
            return self._frames[i]
        return None

    def add(self, first: int, last: int, frame: bytes) -> None:
        """Keep a frame: a record (``first == last``) or a batch, after every one kept."""
        if first == last:
            self.records[first] = frame
            return
        self._firsts.append(first)
        self._lasts.append(last)
        self._frames.append(frame)

    def drop_oldest(self, first: int, last: int) -> None:
        """Forget the frame from ``first`` to ``last``: the oldest kept of its kind."""
        if first == last:
            self.records.pop(first, None)
            return
        start = self._start
        if start < len(self._frames) and self._firsts[start] == first:
            self._frames[start] = None
            self._start = start = start + 1
            if start >= 64 and 2 * start >= len(self._frames):  # now and then: amortised O(1)
                del self._firsts[:start], self._lasts[:start], self._frames[:start]
                self._start = 0
