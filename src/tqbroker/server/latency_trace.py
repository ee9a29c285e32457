"""Per-stage timing of messages through the broker: a debugging aid, off unless the environment
variable ``TQBROKER_LATENCY_TRACE`` names a file (``benchmarks/latency_stages.py`` sets it).

Responsibilities:
- ``TRACE``: the one ``LatencyTrace`` of the process, or None (then the hooks in
  ``connection.py`` and ``writer.py`` are one ``is not None`` test each);
- stamps (``time.perf_counter_ns``, the clock a client's ``perf_counter_ns`` reads too, so the
  broker's times and the client's compare) into arrays preallocated for ``CAPACITY`` messages
  (~57 MB; later messages are not traced), per message: the read that
  brought it returned, its frames parsed, routed and enqueued, its delivery encoded into the
  writer's buffer, that buffer's ``send_all`` begun and returned; a message is known by the
  first 8 bytes of its body (the load generator's send stamp), so a publish and its delivery
  meet without a field on the message;
- garbage collector pauses (``gc.callbacks``), to tell them from scheduling delays;
- ``dump``: the whole record as JSON, written (atomically) whenever a connection closes.
"""

from __future__ import annotations

import gc
import json
import os
import struct
import time
from array import array

ENV = "TQBROKER_LATENCY_TRACE"
STAGES = ("read", "parsed", "routed", "encoded", "send_start", "sent")
READ, PARSED, ROUTED, ENCODED, SEND_START, SENT = range(len(STAGES))
CAPACITY = 1 << 20  # messages traced
GC_CAPACITY = 1 << 16

_STAMP = struct.Struct("<q")
_now = time.perf_counter_ns


class LatencyTrace:
    """Stage times of up to ``capacity`` messages, and the GC pauses meanwhile."""

    def __init__(self, path: str, capacity: int = CAPACITY) -> None:
        self.path = path
        self.capacity = capacity
        width = len(STAGES)
        self.times = array("q", bytes(8 * width * capacity))
        self.stamps = array("q", bytes(8 * capacity))
        self.slots: dict[int, int] = {}  # body stamp -> slot, while the message is in flight
        self.count = 0
        self.read_at = 0  # when the current read returned
        self.gc_pauses = array("q", bytes(8 * 2 * GC_CAPACITY))
        self.gc_count = 0
        self._gc_started = 0

    # -- the publishing side (the reader task) ---------------------------------------------

    def read(self) -> None:
        self.read_at = _now()

    def parsed(self, body: bytes) -> int:
        """A publish came out of the parser: its slot (-1: not traced)."""
        slot = self.count
        if slot >= self.capacity or len(body) < 8:
            return -1
        stamp = _STAMP.unpack_from(body)[0]
        self.count = slot + 1
        self.stamps[slot] = stamp
        self.slots[stamp] = slot
        base = slot * len(STAGES)
        self.times[base + READ] = self.read_at
        self.times[base + PARSED] = _now()
        return slot

    def routed(self, slots: list[int]) -> None:
        """The publishes ``parsed`` gave these slots are routed and enqueued."""
        now = _now()
        times = self.times
        for slot in slots:
            if slot >= 0:
                times[slot * len(STAGES) + ROUTED] = now

    # -- the delivering side ---------------------------------------------------------------

    def encoded(self, body: bytes | memoryview) -> int:
        """A delivery of this body went into a writer's buffer: its slot (-1: not traced)."""
        if len(body) < 8:
            return -1
        slot = self.slots.pop(_STAMP.unpack_from(body)[0], -1)
        if slot >= 0:
            self.times[slot * len(STAGES) + ENCODED] = _now()
        return slot

    def sent(self, slots: list[int], started: int) -> None:
        """The buffer holding these deliveries was handed to the kernel."""
        now, times, width = _now(), self.times, len(STAGES)
        for slot in slots:
            if slot >= 0:
                times[slot * width + SEND_START] = started
                times[slot * width + SENT] = now

    # -- garbage collector pauses ----------------------------------------------------------

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = _now()
        elif self.gc_count < GC_CAPACITY:
            i = 2 * self.gc_count
            self.gc_pauses[i] = self._gc_started
            self.gc_pauses[i + 1] = _now()
            self.gc_count += 1

    # -- output ----------------------------------------------------------------------------

    def dump(self) -> None:
        width, n = len(STAGES), self.count
        record = {
            "stages": list(STAGES),
            "stamps": self.stamps[:n].tolist(),
            "times": self.times[: n * width].tolist(),
            "gc_pauses": self.gc_pauses[: 2 * self.gc_count].tolist(),
        }
        temporary = f"{self.path}.tmp"
        with open(temporary, "w") as file:
            json.dump(record, file)
        os.replace(temporary, self.path)


def _from_environment() -> LatencyTrace | None:
    path = os.environ.get(ENV)
    if not path:
        return None
    trace = LatencyTrace(path)
    gc.callbacks.append(trace.on_gc)
    return trace


TRACE = _from_environment()
