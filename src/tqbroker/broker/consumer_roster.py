"""Who consumes from a queue: its consumers by ``x-priority``, highest first, in registration
order among equals (``ConsumerRoster``), as the management API lists them and as a single
active consumer is chosen (the first).

Registering and cancelling a consumer cost O(1), the first consumer O(log p) amortised (p: the
distinct priorities), however many consumers there are; the consumers of a closing channel
leave in one call at C speed (``remove_all``). Which consumer a classic queue delivers to next
is not the roster's business but its ``ConsumerRing``'s (``consumer_ring.py``).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Collection, Iterator
from itertools import repeat

from .consumer import Consumer


class ConsumerRoster:
    """A queue's consumers in priority order (see the module's docstring)."""

    __slots__ = ("_count", "_levels", "_priorities")

    def __init__(self) -> None:
        # The consumers of each priority, in registration order (dict order; ``OrderedDict``
        # finds its first in constant time after any number of removals).
        self._levels: dict[int, OrderedDict[Consumer, None]] = {}
        # A heap of the priorities, negated; entries of levels since emptied are dropped lazily.
        self._priorities: list[int] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Consumer]:
        """The consumers in order, as they were when the iteration started."""
        levels = self._levels
        snapshot = [list(levels[priority]) for priority in sorted(levels, reverse=True)]
        for level in snapshot:
            yield from level

    def first(self) -> Consumer | None:
        """The first consumer of the highest priority (None: there is none)."""
        heap, levels = self._priorities, self._levels
        while heap:
            level = levels.get(-heap[0])
            if level:
                return next(iter(level))
            heapq.heappop(heap)
        return None

    def add(self, consumer: Consumer) -> None:
        level = self._levels.get(consumer.priority)
        if level is None:
            level = self._levels[consumer.priority] = OrderedDict()
            heapq.heappush(self._priorities, -consumer.priority)
            if len(self._priorities) > 2 * len(self._levels) + 16:  # stale entries: rebuild
                self._priorities = [-priority for priority in self._levels]
                heapq.heapify(self._priorities)
        level[consumer] = None
        self._count += 1

    def remove_all(self, gone: Collection[Consumer]) -> int:
        """Drop ``gone`` (those not here are ignored); how many were here."""
        levels = self._levels
        removed = 0
        if len(levels) == 1:  # the common case, at C speed: 100k in a few milliseconds
            (level,) = levels.values()
            removed = len(level)
            deque(map(level.pop, gone, repeat(None)), maxlen=0)
            removed -= len(level)
        else:
            for consumer in gone:
                of_priority = levels.get(consumer.priority)
                if of_priority is not None and consumer in of_priority:
                    del of_priority[consumer]
                    removed += 1
        for priority in [priority for priority, level in levels.items() if not level]:
            del levels[priority]
        self._count -= removed
        return removed

    def clear(self) -> list[Consumer]:
        """Drop every consumer; those there were, in order."""
        consumers = list(self)
        self._levels.clear()
        self._priorities.clear()
        self._count = 0
        return consumers
