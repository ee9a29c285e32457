"""Group commit: one task per durable backend that makes writes durable in batches (the
broker's ``plugins.spec.GroupCommit``).

Responsibilities:
- tickets: ``request()`` returns a number; once ``completed`` reaches it, everything written before
  the request is durable (a flush that began after the request has finished);
- the loop: wait until asked, take the backend's flush work (``Backend.begin_flush``) and run it
  in a worker thread, so one fsync covers every message appended meanwhile; the thread starts
  at once (``run_in_thread``), not after a turn of the scheduler;
- telling whoever waits: channels confirm (or, on failure, nack) their publishes; queues that
  paused for a flush resume;
- after a failure, retry once a second while the backend has something to flush;
- for the metrics: each flush's duration and the requests it covered (``Histogram``s);
- ``busy_since``: when the running flush began (a cluster node's lease renewals stop when its
  disk hangs).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Protocol

import outcome
import trio

from ..plugins.spec import FlushListener, GroupCommit
from .stats import BATCH_BUCKETS, FSYNC_BUCKETS, Histogram


class Wakeable(Protocol):
    """What waits for a flush to have finished: a queue whose readers stop at the durable
    end, a stream partition whose fetches wait for its high watermark."""

    def wake(self) -> None: ...


log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
POLL_SECONDS = 0.2


async def run_in_thread(work: Callable[[], None]) -> None:
    """Run ``work`` in a worker thread and wait for it (raising what it raised), like
    ``trio.to_thread.run_sync``, but the thread starts now: ``run_sync`` first takes a token of
    its capacity limiter, which yields to the scheduler, so that on a busy loop the fsync began
    only after the other tasks had run (~0.2-0.3 ms more per group commit, on the path of
    every confirm). A cancellation waits for the thread, as ``run_sync`` does by default."""
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()

    def deliver(result: outcome.Outcome[None]) -> None:  # in the worker thread
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(work, deliver, name="tqbroker flush")
    await trio.lowlevel.wait_task_rescheduled(_wait_for_thread)


def _wait_for_thread(_raise_cancel: object) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED  # the thread cannot be stopped: its result comes anyway


class Flushable(Protocol):
    """What a flusher drives: a durable backend (``backends.base.Backend``), or the definitions
    file."""

    name: str

    @property
    def needs_flush(self) -> bool: ...

    @property
    def healthy(self) -> bool: ...

    def begin_flush(self) -> Callable[[], None] | None: ...


class Flusher:
    def __init__(self, backend: Flushable) -> None:
        self.backend = backend
        self.requested = 0
        self.completed = 0
        self._wakeup = trio.Event()
        self._listeners: set[FlushListener] = set()
        # Trio's clock when the flush work now running began (None: none runs): a cluster
        # node stops renewing its lease when this is too long ago (its disk hangs).
        self.busy_since: float | None = None
        self._waiting: set[Wakeable] = set()
        self._callbacks: list[Callable[[], None]] = []
        # For the metrics: how long each flush's work took (its fsyncs), and how many requests
        # (publishes, deletes...) each flush covered: the group commit's batch size.
        self.flush_seconds = Histogram(FSYNC_BUCKETS)
        self.batch_sizes = Histogram(BATCH_BUCKETS)

    @property
    def healthy(self) -> bool:
        return self.backend.healthy

    def request(self) -> int:
        """A ticket for everything written so far."""
        self.requested += 1
        self._wakeup.set()
        return self.requested

    def listen(self, listener: FlushListener) -> None:
        self._listeners.add(listener)

    def unlisten(self, listener: FlushListener) -> None:
        self._listeners.discard(listener)

    async def wait(self, ticket: int) -> bool:
        """Wait until ``ticket`` is durable (True) or its flush failed (False): for callers
        that can wait, such as an HTTP request; channels listen instead."""
        waiter = _Waiter(ticket)
        self.listen(waiter)
        try:
            if self.completed < ticket:
                await waiter.done.wait()
            return waiter.ok
        finally:
            self.unlisten(waiter)

    def poke(self) -> None:
        """Run a flush soon (the backend asked for one)."""
        self._wakeup.set()

    def call_after_flush(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the next flush has finished (successfully or not)."""
        self._callbacks.append(callback)
        self._wakeup.set()

    def wake_after_flush(self, waiter: Wakeable) -> None:
        """``waiter`` (a queue, a partition) cannot go on before the next flush: run one and
        wake it afterwards."""
        self._waiting.add(waiter)
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            # Also look now and then: a policy such as fsync "interval" has deferred work.
            with trio.move_on_after(POLL_SECONDS):
                await self._wakeup.wait()
            if not self._wakeup.is_set() and not self.backend.needs_flush:
                continue
            self._wakeup = trio.Event()
            covering = self.requested
            try:
                work = self.backend.begin_flush()
                if work is not None:
                    started = time.perf_counter()
                    self.busy_since = trio.current_time()
                    try:
                        await run_in_thread(work)
                    finally:
                        self.busy_since = None
                    self.flush_seconds.observe(time.perf_counter() - started)
                    self.batch_sizes.observe(covering - self.completed)
            except Exception as exc:
                # Every outstanding ticket fails, not only those this flush covered: records
                # written since may share the failed pages and must never be acked. A bug in the
                # backend (anything but OSError) fails the flush the same way, with a traceback.
                failed = self.requested
                log.error(
                    "%s backend: flush failed: %s",
                    self.backend.name,
                    exc,
                    exc_info=not isinstance(exc, OSError),
                )
                self._tell(functools.partial(_fail, commit=self, upto=failed))
                self.completed = failed
                self._run_callbacks()
                await trio.sleep(RETRY_SECONDS)
                if self.backend.needs_flush:
                    self._wakeup.set()
                continue
            self.completed = covering
            self._tell(lambda listener: listener.flushed(self))
            if self._waiting:
                waiting, self._waiting = self._waiting, set()
                for waiter in waiting:
                    waiter.wake()
            self._run_callbacks()

    def _tell(self, call: Callable[[FlushListener], None]) -> None:
        """Call every listener; one that raises (a bug) is logged and stops listening, and the
        others are still told."""
        for listener in list(self._listeners):
            try:
                call(listener)
            except Exception:
                log.exception("%s backend: a flush listener failed; dropping it", self.backend.name)
                self._listeners.discard(listener)

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("%s backend: an after-flush callback failed", self.backend.name)


def _fail(listener: FlushListener, *, commit: GroupCommit, upto: int) -> None:
    listener.flush_failed(commit, upto)


class _Waiter:
    """``Flusher.wait``'s listener."""

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket
        self.ok = True
        self.done = trio.Event()

    def flushed(self, commit: GroupCommit) -> None:
        if commit.completed >= self.ticket:
            self.done.set()

    def flush_failed(self, commit: GroupCommit, upto: int) -> None:
        if self.ticket <= upto:
            self.ok = False
            self.done.set()
