"""What every fuzz target shares: the registry, the time budget, and splitting one input.

A target is a function of one ``bytes`` input that returns normally when the component under
test did what it documents (accepted the input, or refused it with its documented error) and
raises anything else: an undocumented exception escaping the component, or an
``AssertionError`` from a property the target checks (chunk independence, round trips).
``check`` runs one input under the time budget: an input that takes longer than
``BUDGET_S`` (100 ms; ``TQBROKER_FUZZ_BUDGET_MS``) on each of five tries, spread over about
a second, is a ``SlowInput``.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

import attrs

BUDGET_S = float(os.environ.get("TQBROKER_FUZZ_BUDGET_MS", "100")) / 1000
# Tries before an input over the budget counts as slow (a loaded machine stalls now and then:
# on a virtual machine whose host is busy, the time the host takes the CPU away is charged to
# the thread that was running, so the tries are spread over a moment: a slow input is slow
# every time, a stall passes).
TRIES = 5
PAUSE_S = 0.05  # before the second try; doubled before each next one


class SlowInput(AssertionError):
    """An input the component took longer than the budget over on every try."""


@attrs.frozen
class Target:
    name: str
    run: Callable[[bytes], None]
    doc: str
    # The largest input libFuzzer generates for this target (its -max_len).
    max_len: int = 4096


TARGETS: dict[str, Target] = {}


def target(
    name: str, *, max_len: int = 4096
) -> Callable[[Callable[[bytes], None]], Callable[[bytes], None]]:
    """Register a fuzz target (its docstring's first paragraph describes it)."""

    def register(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        TARGETS[name] = Target(name, fn, doc, max_len)
        return fn

    return register


def check(fn: Callable[[bytes], None], data: bytes, budget: float = BUDGET_S) -> None:
    """Run ``fn(data)``; raise ``SlowInput`` if it took over ``budget`` seconds of this
    thread's CPU time ``TRIES`` times (CPU time, the garbage collector off: a busy machine or a
    large heap does not make it slow)."""
    best = float("inf")
    pause = PAUSE_S
    for _ in range(TRIES):
        # The garbage collector off while timed: a full collection of the test process's heap
        # (the suite has built up a lot by then) is not the input's cost.
        gc.disable()
        try:
            start = time.thread_time()
            fn(data)
            best = min(best, time.thread_time() - start)
        finally:
            gc.enable()
        if best <= budget:
            return
        time.sleep(pause)
        pause *= 2
    raise SlowInput(
        f"{best * 1000:.1f} ms for a {len(data)}-byte input (budget {budget * 1000:.0f} ms)"
    )


class Reader:
    """Bytes consumed from the front (choices: small integers, flags) and the rest kept as
    payload: a fixed layout, so that libFuzzer's mutations of a byte keep their meaning."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return self.byte() << 8 | self.byte()

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return chunk

    def rest(self) -> bytes:
        chunk = self.data[self.pos :]
        self.pos = len(self.data)
        return chunk

    def parts(self, count: int) -> list[bytes]:
        """``count`` pieces: each but the last prefixed by a u16 length."""
        pieces = [self.take(self.u16()) for _ in range(count - 1)]
        return [*pieces, self.rest()]


def chunkings(data: bytes, seed: bytes) -> list[bytes]:
    """``data`` cut into chunks whose sizes the ``seed`` bytes choose (1..256 each, cycling;
    the sizes ``1`` everywhere when the seed is empty)."""
    sizes = [b + 1 for b in seed] or [1]
    chunks, pos, i = [], 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        chunks.append(data[pos : pos + size])
        pos += size
        i += 1
    return chunks
