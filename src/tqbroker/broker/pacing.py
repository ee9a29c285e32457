"""Long jobs on the event loop give way to everyone else: a ``Pacer`` yields to the other tasks
once a job has run for ``SLICE_SECONDS``, or done ``max_items`` items, since it last did, so
that tearing down a connection with 100k exclusive queues or producing a 500k-record batch never
stalls another client for long. ``max_items`` bounds work that an item starts elsewhere: each
deleted queue's actor task ends in the scheduling round after the yield. ``Slice`` tells a loop
that must do something before it yields (a connection's read loop) when its slice is over.
``release`` frees a long list's items a slice at a time, for the same reason."""

from __future__ import annotations

import time
from typing import Any, Final

import trio
import trio.lowlevel

# A client's round trip takes a few scheduling rounds, each of which may hold one slice of a
# long job: with 10 ms slices a canary's round trips during a 500k-record produce took ~40 ms
# (p99), with 5 ms ~22 ms, the job no slower.
SLICE_SECONDS: Final = 0.005
RELEASE_SLICE: Final = 10_000


class Pacer:
    def __init__(self, slice_seconds: float = SLICE_SECONDS, max_items: int | None = None) -> None:
        self._slice = slice_seconds
        self._max_items = max_items
        self._items = 0
        self._since = time.perf_counter()

    async def step(self) -> None:
        """Call after each item: a checkpoint once the slice or the item budget is used up."""
        self._items += 1
        max_items = self._max_items
        if (max_items is not None and self._items >= max_items) or (
            time.perf_counter() - self._since >= self._slice
        ):
            await trio.lowlevel.checkpoint()
            self._items = 0
            self._since = time.perf_counter()


class Slice:
    """``Pacer`` without the yield: ``used(items)`` after each step says whether the slice is
    over (the caller then gives way and a new slice begins). The clock is looked at every
    ``look_every`` items, so a step of a few microseconds does not pay for it."""

    __slots__ = ("_ends", "_items", "_look_at", "_look_every")

    def __init__(self, look_every: int = 64) -> None:
        self._look_every = self._look_at = look_every
        self._items = 0
        self._ends = time.perf_counter() + SLICE_SECONDS

    def used(self, items: int = 1) -> bool:
        self._items += items
        if self._items < self._look_at:
            return False
        self._look_at = self._items + self._look_every
        now = time.perf_counter()
        if now < self._ends:
            return False
        self._ends = now + SLICE_SECONDS
        return True


async def release(items: list[Any]) -> None:
    """Empty ``items``, ``RELEASE_SLICE`` at a time with a checkpoint between (shielded: it is
    short), for a list that holds the last reference to each: dropping 500k records at once
    holds the event loop for ~100 ms."""
    with trio.CancelScope(shield=True):
        while items:
            del items[-RELEASE_SLICE:]
            await trio.lowlevel.checkpoint()
