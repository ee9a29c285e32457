"""The garbage collector's policy in a process the broker owns (``python -m tqbroker``).

Reference counting frees nearly everything the broker allocates; what the collector adds is
cycles. But a broker holds millions of long-lived objects (100k queues with a consumer each are
~3M), and CPython's full collections walk them all whenever the heap grew by a quarter: with
(20000, 5, 10), 24 s of pauses while 100k queues were declared and consumed, one of 7.9 s. The
policy:

- ``take_over``: the objects of the imported modules frozen (never walked again); a young
  collection every ``YOUNG`` allocations, a middle one after ``MIDDLE`` young ones (100k
  pipelined declares: young pauses under 5 ms, middle under 10 ms; with (5000, 2) middle ones
  took 17-30 ms); no automatic full collection (``NEVER``);
- ``FullCollections.run`` (a broker task, in a process taken over): a full collection only
  while memory is short (the memory monitor's pressure), at most once per ``FULL_EVERY``
  seconds: cyclic garbage that reached the old generation is reclaimed when memory matters.

The young generation's count is allocations less frees, of any generation: replacing an old
object by a new one (a woken queue actor's event, a sampled counter tuple) counts nothing but
lengthens the young list. 100k actors woken at once left ~480k young objects for a 180 ms young
pause; queues do not wake idle actors, nor the stats sampler sample idle objects, for that.

An embedded broker (``tqbroker.testing``, an application's own ``trio.run``) leaves its host
process's collector as it was: ``take_over`` is the command line's, and a broker runs its full
collections only in a process taken over.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Final

import trio

log = logging.getLogger(__name__)

YOUNG: Final = 1_000  # allocations (net) between two young collections
MIDDLE: Final = 1  # young collections between two middle ones
NEVER: Final = 2**31 - 1  # middle collections before a full one: never, in effect
FULL_EVERY: Final = 60.0  # seconds between two full collections, at least
LOOK_EVERY: Final = 1.0  # seconds between two looks at the memory pressure

_taken_over = False


def take_over() -> None:
    """Apply the policy to this process (once imports are done, before ``trio.run``)."""
    global _taken_over
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, NEVER)
    _taken_over = True


def taken_over() -> bool:
    """Whether this process's collector follows the policy (then the broker runs
    ``FullCollections``)."""
    return _taken_over


class FullCollections:
    """Full collections while ``pressed()`` says memory is short, at most one per ``every``
    seconds (``collect``: ``gc.collect``, or a test's)."""

    def __init__(
        self,
        pressed: Callable[[], bool],
        *,
        every: float = FULL_EVERY,
        collect: Callable[[], int] = gc.collect,
    ) -> None:
        self._pressed = pressed
        self._every = every
        self._collect = collect
        self.collections = 0

    async def run(self) -> None:
        last = -self._every
        while True:
            await trio.sleep(LOOK_EVERY)
            now = trio.current_time()
            if now - last < self._every or not self._pressed():
                continue
            began = time.perf_counter()
            found = self._collect()
            last = trio.current_time()
            self.collections += 1
            log.info(
                "memory pressure: a full garbage collection freed %d objects in %.0f ms",
                found,
                (time.perf_counter() - began) * 1000,
            )
