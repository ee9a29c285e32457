"""``pacing.Slice``: a loop that must act before it yields (the connection's read loop) learns
its slice is over only after a slice's time has passed, looking at the clock once per
``look_every`` items, and items may come in heaps (a run of publishes counts as its
publishes)."""

from __future__ import annotations

import time

import pytest

from tqbroker.broker import pacing
from tqbroker.broker.pacing import Slice


def test_a_slice_is_over_only_once_its_time_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])  # pacing reads time.perf_counter
    pace = Slice(look_every=4)
    assert not any(pace.used() for _ in range(10))  # no time passed
    now[0] += pacing.SLICE_SECONDS
    assert [pace.used() for _ in range(4)] == [False, True, False, False]  # the next look
    now[0] += pacing.SLICE_SECONDS
    assert pace.used(256)  # a heap of items is a look at once
    assert not pace.used(256)  # a new slice began


def test_the_clock_is_read_once_per_look(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def perf_counter() -> float:
        reads.append(1)
        return 0.0

    monkeypatch.setattr(time, "perf_counter", perf_counter)
    pace = Slice(look_every=64)
    for _ in range(640):
        pace.used()
    assert len(reads) == 1 + 10  # the start, then every 64 items
