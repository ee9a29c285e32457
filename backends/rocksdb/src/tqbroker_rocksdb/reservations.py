"""Delivery reservations of the RocksDB backend.

Responsibilities:
- ``Reservation``: one queue's reservation: no persistent message at or above the durable
  ``reserved`` is ever popped, so after a restart a survivor below it comes back flagged
  redelivered and one at or above it unflagged;
- ``ReservationPlanner``: which queues get an extension at the next flush, and how far (an
  adaptive window between ``minimum`` and ``maximum``).

See "RocksDB backend" in docs/storage-format.md for the policy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .codec import pack_u64
from .writer import Writer

if TYPE_CHECKING:
    from .store import RocksDBQueueStore

log = logging.getLogger(__name__)


class Reservation:
    """One queue's delivery reservation."""

    __slots__ = ("key", "popped", "reserved", "target", "window")

    def __init__(self, key: bytes, reserved: int, window: int) -> None:
        self.key = key
        """The reservation's key in the database."""
        self.reserved = reserved
        """Durable: ``pop`` hands out no persistent message at or above it."""
        self.target = reserved
        """The highest reservation recorded in a batch (durable once that batch is written)."""
        self.popped = 0
        """Persistent fresh pops since the last extension (sizes the next one)."""
        self.window = window
        """The window of the last extension."""

    def grant(self, reserved: int) -> None:
        """A batch recording ``reserved`` was written: it holds now."""
        self.reserved = max(self.reserved, reserved)


class ReservationPlanner:
    """Tracks which queues are consumed and extends their reservations at each flush.

    Stores report to ``pushed`` (pushed to), ``active`` (``pop`` called) and ``wanting`` (a pop
    refused: reservation exhausted), all since the last flush; ``consuming`` is what was active
    or wanting at the last flush."""

    def __init__(self, writer: Writer, minimum: int, maximum: int) -> None:
        self._writer = writer
        self.minimum = minimum
        self.maximum = maximum
        self.pushed: set[RocksDBQueueStore] = set()
        self.active: set[RocksDBQueueStore] = set()
        self.wanting: set[RocksDBQueueStore] = set()
        self.consuming: set[RocksDBQueueStore] = set()

    def extend(self, store: RocksDBQueueStore, reservation: int) -> None:
        """Record an extension of ``store``'s reservation to ``reservation`` in the current
        batch (if it is one)."""
        state = store.reservation
        if reservation > state.target:
            state.target = reservation
            self._writer.ops[state.key] = pack_u64(reservation)
            self._writer.reservations.append((state, reservation))

    def plan(self) -> None:
        """Extend the reservations of the queues being consumed (at the start of a flush)."""
        # Queues with consumers: popped or refused since the last flush, or popped before it and
        # pushed to since (their consumers are waiting for the new messages). "Running low" is
        # judged against the current window, as ``wants_flush`` does.
        candidates = self.wanting | self.active | (self.pushed & self.consuming)
        for store in candidates:
            state = store.reservation
            cursor = store.cursor()
            if store in self.wanting or state.target - cursor < state.window // 2:
                # Slow start: a consumer that got through half the window since the last
                # extension gets twice as much; one that used less than a quarter, half.
                popped, state.popped = state.popped, 0
                window = state.window
                if popped >= window // 2:
                    window = min(self.maximum, 2 * window)
                elif popped < window // 4:
                    window = max(self.minimum, window // 2)
                state.window = window
                self.extend(store, cursor + window)
        self.consuming = self.wanting | self.active
        self.wanting.clear()
        self.active.clear()
        self.pushed.clear()

    def forget(self, store: RocksDBQueueStore) -> None:
        """``store``'s queue was deleted: drop its unwritten extension and stop tracking it."""
        writer = self._writer
        writer.ops.pop(store.reservation.key, None)
        writer.reservations = [r for r in writer.reservations if r[0] is not store.reservation]
        for tracked in (self.pushed, self.active, self.wanting, self.consuming):
            tracked.discard(store)

    def clear(self) -> None:
        for tracked in (self.pushed, self.active, self.wanting):
            tracked.clear()
        self.consuming = set()
