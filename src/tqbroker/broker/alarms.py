"""Resource alarms, RabbitMQ's: memory over its high watermark, free disk under its limit.

Responsibilities:
- ``ResourceAlarms``: which alarms are set, the reason a blocked publisher is told (RabbitMQ's
  texts: ``low on memory``, ``low on disk``, ``low on disk & memory``), a wait for all of them to
  clear, and the log lines on set and clear;
- ``MemoryMonitor``: every ``MEMORY_CHECK_SECONDS``, the broker's memory use against
  ``memory_high_watermark`` (a fraction of the memory available, or absolute), and whether it is
  past half of it (memory pressure: in-memory queues then page out sooner);
- ``DiskMonitor``: the free space of the data directory against ``disk_free_limit``, checked
  every ``DISK_CHECK_SECONDS`` (more often near the limit) in a worker thread, and once before
  the broker opens its storage, so that a broker started on a full disk starts with the alarm
  set rather than failing.

While any alarm is set, connections that publish are blocked (``server/flow.py``); consumers
go on being served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

import trio

from ..resources import Limit, ResidentSet, available_memory, free_disk_bytes

log = logging.getLogger(__name__)

MEMORY: Final = "memory"
DISK: Final = "disk"
MEMORY_CHECK_SECONDS: Final = 0.2
DISK_CHECK_SECONDS: Final = 2.0
DISK_CHECK_SECONDS_NEAR_LIMIT: Final = 0.1
# Past this share of the memory high watermark, long queues page out to disk sooner.
PRESSURE_FRACTION: Final = 0.5


class ResourceAlarms:
    """The alarms set now (``active``), and a wait for them to clear."""

    def __init__(self) -> None:
        self.active: dict[str, str] = {}  # resource -> what was measured, for logs and health
        self._a_clear = trio.Event()  # set (and replaced) whenever an alarm clears

    @property
    def reason(self) -> str:
        """What ``connection.blocked`` says (RabbitMQ's text)."""
        return "low on " + " & ".join(sorted(self.active))

    def set(self, resource: str, measured: str) -> None:
        if resource in self.active:
            self.active[resource] = measured
            return
        self.active[resource] = measured
        log.warning(
            "%s resource limit alarm set: %s; publishers will be blocked until this alarm clears",
            resource,
            measured,
        )

    def clear(self, resource: str, measured: str) -> None:
        if self.active.pop(resource, None) is None:
            return
        log.warning("%s resource limit alarm cleared: %s", resource, measured)
        cleared, self._a_clear = self._a_clear, trio.Event()
        cleared.set()

    async def wait_cleared(self, resource: str | None = None) -> None:
        """Return once no alarm is set (with ``resource``: once its alarm is not)."""
        while resource in self.active if resource is not None else self.active:
            await self._a_clear.wait()


class MemoryMonitor:
    """Sets and clears the memory alarm."""

    def __init__(
        self,
        alarms: ResourceAlarms,
        watermark: Limit,
        on_pressure: Callable[[bool], None] = lambda _pressed: None,
    ) -> None:
        self.alarms = alarms
        self.limit = watermark.bytes(available_memory())
        self.used = 0  # the last measurement
        self.pressed = False  # over PRESSURE_FRACTION of the watermark: queues page out sooner
        self._on_pressure = on_pressure
        self._resident = ResidentSet()

    def check(self) -> None:
        self.used = used = self._resident.in_use(self.limit)
        pressed = used > PRESSURE_FRACTION * self.limit
        if pressed != self.pressed:
            self.pressed = pressed
            self._on_pressure(pressed)
        measured = f"memory use {_size(used)}, high watermark {_size(self.limit)}"
        if used > self.limit:
            self.alarms.set(MEMORY, measured)
        else:
            self.alarms.clear(MEMORY, measured)

    async def run(self) -> None:
        while True:
            try:
                self.check()
            except OSError as exc:  # the alarm stays as it is until a check works again
                log.error("cannot measure the broker's memory: %s", exc)
            await trio.sleep(MEMORY_CHECK_SECONDS)


class DiskMonitor:
    """Sets and clears the disk alarm for the data directory's file system."""

    def __init__(
        self,
        alarms: ResourceAlarms,
        directory: Path,
        limit: Limit,
        *,
        free_bytes: Callable[[Path], int] = free_disk_bytes,
    ) -> None:
        self.alarms = alarms
        self.directory = directory
        self.limit = limit.bytes(available_memory())
        self.free = -1  # the last measurement
        self._free_bytes = free_bytes

    async def check(self) -> float:
        """Measure (in a worker thread), set or clear the alarm; return how long to wait before
        the next check."""
        try:
            self.free = free = await trio.to_thread.run_sync(self._free_bytes, self.directory)
        except OSError as exc:
            log.error("cannot measure the free disk space of %s: %s", self.directory, exc)
            return DISK_CHECK_SECONDS
        measured = f"free disk space {_size(free)}, limit {_size(self.limit)}"
        if free < self.limit:
            self.alarms.set(DISK, measured)
        else:
            self.alarms.clear(DISK, measured)
        near = free < 2 * self.limit + 256 * 1024 * 1024
        return DISK_CHECK_SECONDS_NEAR_LIMIT if near else DISK_CHECK_SECONDS

    async def run(self) -> None:
        while True:
            wait = await self.check()
            await trio.sleep(wait)


def _size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
