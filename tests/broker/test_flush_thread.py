"""The flusher's hand-off to its worker thread (``broker/flusher.py``, ``run_in_thread``): the
thread starts before the scheduler gives other tasks a turn (a busy loop would otherwise delay
every group commit's fsync by a round of its tasks), the work's error reaches the flusher, and a
cancellation waits for the thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import trio

from tqbroker.broker.flusher import run_in_thread


async def test_the_thread_starts_before_other_tasks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    start_thread_soon = trio.lowlevel.start_thread_soon

    def recording(fn: Callable[[], object], deliver: Callable[..., object], **kwargs: str) -> None:
        order.append("thread started")
        start_thread_soon(fn, deliver, **kwargs)

    monkeypatch.setattr(trio.lowlevel, "start_thread_soon", recording)  # the flusher's

    async def other() -> None:
        order.append("another task ran")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)  # runnable before the flush begins
        await run_in_thread(lambda: None)
    assert order == ["thread started", "another task ran"]


async def test_the_work_runs_in_another_thread_and_its_error_is_raised() -> None:
    threads: list[threading.Thread] = []

    def failing() -> None:
        threads.append(threading.current_thread())
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        await run_in_thread(failing)
    assert threads
    assert threads[0] is not threading.current_thread()


async def test_a_cancellation_waits_for_the_thread() -> None:
    done = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        done.set()

    with trio.move_on_after(0.01):
        await run_in_thread(slow)
    assert done.is_set()  # an fsync in flight is never abandoned
