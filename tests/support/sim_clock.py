"""A virtual clock for the cluster simulation that knows about worker threads.

``trio.testing.MockClock(autojump_threshold=0)`` jumps to the next deadline as soon as every
task is blocked, and a task waiting for a worker thread is blocked: while a flusher's thread
does its file I/O the clock races ahead (in one run, 140 virtual seconds passed before the
three nodes were in sync, 0.5 s of real time), a flush looks pending for longer than TTL/2 and
the node's lease renewals stop (``membership``: a stuck disk), publishes time out: nothing is
confirmed. A larger ``autojump_threshold`` only makes that rarer (a slow fsync still jumps) and
lets a busy run go at real speed.

``SimClock`` is Trio's real clock that skips idle time: it jumps to the next deadline only when
every task is blocked **and** no worker thread is busy: none of ``trio.to_thread``'s threads
(its default limiter's borrowed tokens) and no flush running on a node (``busy()``, given by the
cluster: each broker's flushers' ``busy_since``, whose thread ``flusher.run_in_thread`` starts
outside that limiter). While a thread works, time passes as on the real clock. (A clock that
stood still instead stalls a run whose producers keep a flusher always busy.) Time is then
sound: never faster than real time while a thread does I/O, so a lease expires or a flush looks
stuck only as it would on the real clock, and the waits for TTLs and elections take no real
time. It is not a deterministic interleaving: when a thread finishes, in real time, still
decides which task runs first, and a jump depends on whether a thread is busy at that moment.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio


class SimClock(trio.abc.Clock):
    def __init__(self, busy: Callable[[], bool] = lambda: False) -> None:
        self.busy = busy  # a node's flush running in a worker thread (set by the cluster)
        self._origin = time.perf_counter()
        self.skipped = 0.0  # seconds of idle time jumped over
        self.jumps = 0

    def start_clock(self) -> None:
        self._origin = time.perf_counter()

    def current_time(self) -> float:
        return time.perf_counter() - self._origin + self.skipped

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # Called by Trio's run loop when no task can run: how long to wait for I/O, in real time.
        wait = deadline - self.current_time()
        if wait <= 0:
            return 0.0
        threads = trio.to_thread.current_default_thread_limiter().borrowed_tokens
        if threads or self.busy() or math.isinf(deadline):
            return wait  # as the real clock: a thread's result wakes Trio sooner
        self.skipped += wait
        self.jumps += 1
        return 0.0
