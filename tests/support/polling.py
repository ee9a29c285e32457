"""Waiting for something to happen: ``eventually(condition)`` calls ``condition`` until it returns
something truthy (and returns that), or raises ``AssertionError`` saying what it waited for.
Tests use it rather than a ``sleep`` long enough on the machine they were written on."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import sniffio

T = TypeVar("T")

TIMEOUT = 10.0
INTERVAL = 0.02


def eventually(
    condition: Callable[[], T | None],
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    *,
    what: str | None = None,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """``condition()``'s first truthy value, polled every ``interval`` seconds for up to
    ``timeout``. An exception of a type in ``ignoring`` counts as "not yet". On timeout the
    ``AssertionError`` names ``what`` (by default the condition's source) and its last value."""
    deadline = time.monotonic() + timeout
    while True:
        last: object
        try:
            last = value = condition()
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(condition, what, timeout, last))
        time.sleep(interval)


async def eventually_async(
    condition: Callable[[], T | Awaitable[T | None] | None],
    timeout: float = TIMEOUT,  # noqa: ASYNC109  (a deadline for the condition, as in eventually)
    interval: float = INTERVAL,
    *,
    what: str | None = None,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """``eventually`` for Trio and asyncio tests: ``condition`` may be a coroutine function, and
    the time is the event loop's (so a Trio ``MockClock`` jumps ahead instead of waiting)."""
    clock, sleep = _event_loop_clock()
    deadline = clock() + timeout
    while True:
        last: object
        try:
            result = condition()
            last = value = await result if inspect.isawaitable(result) else result
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
        if clock() >= deadline:
            raise AssertionError(_timed_out(condition, what, timeout, last))
        await sleep(interval)


def file_containing(path: Path, text: str, timeout: float = TIMEOUT) -> str:
    """The content of ``path`` once it contains ``text`` (a log file being written; missing
    for a moment while it is being rotated counts as not yet)."""

    def content_with_text() -> str:
        content = path.read_text()
        return content if text in content else ""

    return eventually(
        content_with_text, timeout, what=f"{text!r} in {path}", ignoring=(FileNotFoundError,)
    )


def _event_loop_clock() -> tuple[Callable[[], float], Callable[[float], Awaitable[None]]]:
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.current_time, trio.sleep
    import asyncio

    return asyncio.get_running_loop().time, asyncio.sleep


def _timed_out(condition: object, what: str | None, timeout: float, last: object) -> str:
    return f"not within {timeout:g} s: {what or _describe(condition)} (last: {last!r})"


def _describe(condition: object) -> str:
    """The condition's source line for a lambda, else its docstring's first line or its name."""
    name = getattr(condition, "__qualname__", repr(condition))
    if name.endswith("<lambda>"):
        try:
            return inspect.getsource(condition).strip()  # type: ignore[arg-type]
        except (OSError, TypeError):
            return name
    doc = inspect.getdoc(condition)
    return doc.splitlines()[0] if doc else str(name)
