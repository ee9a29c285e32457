"""The broker's clock: wall-clock milliseconds read through Trio.

Responsibilities:
- ``now_ms``: epoch milliseconds that advance with ``trio.current_time()``, so every timer in the
  broker (message TTL, queue expiry, consumer timeouts, delayed delivery) follows Trio's clock and
  tests drive it with ``trio.testing.MockClock``, while stored timestamps stay real wall-clock
  times across restarts;
- ``to_trio``: the Trio deadline of an epoch-millisecond instant (for ``trio.sleep_until``);
- ``parse_iso_time``: an ISO-8601 time as users write it (UTC unless it names a zone).

The offset between the two clocks is fixed once per Trio run.
"""

from __future__ import annotations

import datetime
import time

import trio
from trio.lowlevel import RunVar

_offset: RunVar[float] = RunVar("tqbroker_clock_offset")


def _epoch_offset() -> float:
    try:
        return _offset.get()
    except LookupError:
        offset = time.time() - trio.current_time()
        _offset.set(offset)
        return offset


def now_ms() -> int:
    """Milliseconds since the epoch, as Trio's clock sees it (call from the Trio thread)."""
    return int((_epoch_offset() + trio.current_time()) * 1000)


def to_trio(epoch_ms: float) -> float:
    """The ``trio.current_time()`` value at which ``now_ms()`` reaches ``epoch_ms``."""
    return epoch_ms / 1000 - _epoch_offset()


def parse_iso_time(text: str) -> datetime.datetime | None:
    """The aware datetime an ISO-8601 text names (UTC if it gives no zone), or None."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
