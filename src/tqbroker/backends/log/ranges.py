"""``RangeSet``: disjoint half-open ranges of ints (a queue's settled and transient offsets)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right


class RangeSet:
    """Disjoint half-open ranges of ints, kept sorted and merged."""

    def __init__(self, ranges: list[tuple[int, int]] | None = None) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        for start, end in ranges or ():
            self.add(start, end)

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = bisect_left(self.ends, start)  # first range that ends at or after start
        j = bisect_right(self.starts, end)  # ranges before j start at or before end
        if i < j:
            start = min(start, self.starts[i])
            end = max(end, self.ends[j - 1])
        self.starts[i:j] = [start]
        self.ends[i:j] = [end]

    def __contains__(self, value: int) -> bool:
        i = bisect_right(self.starts, value) - 1
        return i >= 0 and value < self.ends[i]

    def pop_prefix(self, head: int) -> int:
        """If a range starts at ``head``, remove it and return its end; else return ``head``."""
        if self.starts and self.starts[0] <= head:
            end = max(head, self.ends[0])
            del self.starts[0]
            del self.ends[0]
            return end
        return head

    def drop_below(self, value: int) -> None:
        while self.starts and self.ends[0] <= value:
            del self.starts[0]
            del self.ends[0]
        if self.starts and self.starts[0] < value:
            self.starts[0] = value

    def as_list(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends, strict=True))

    def __len__(self) -> int:
        return len(self.starts)
