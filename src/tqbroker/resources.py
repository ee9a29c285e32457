"""Resource limits, as RabbitMQ states them, and what this machine and process have.

Responsibilities:
- parse a limit the way ``rabbitmq.conf`` writes one: a fraction (``0.4``: of the memory
  available; for the disk limit, a multiple of it), or an absolute size (``512MiB``, ``50MB``,
  ``1073741824``) with RabbitMQ's units (``k``/``KiB``, ``M``/``MiB``, ``G``/``GiB`` are powers
  of 1024; ``kB``/``KB``, ``MB``, ``GB`` powers of 1000);
- the memory available: the machine's RAM, or the cgroup's limit when it is lower (a container);
- the broker's memory use: its resident set, after handing the allocator's free pages back to the
  system (``malloc_trim``) when it looks over the limit, so that memory freed by a consumer or a
  queue delete counts as free;
- the free space on the data directory's file system.

File descriptors are the file-handle cache's business (``storage_env.filecache``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs

_UNITS: Final = {
    "": 1,
    "k": 1024,
    "K": 1024,
    "kiB": 1024,
    "KiB": 1024,
    "M": 1024**2,
    "MiB": 1024**2,
    "G": 1024**3,
    "GiB": 1024**3,
    "T": 1024**4,
    "TiB": 1024**4,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}
_ABSOLUTE = re.compile(r"(\d+)\s*([A-Za-z]*)")
_RELATIVE = re.compile(r"\d*\.\d+|\d+\.\d*")
_CGROUP_V2 = Path("/sys/fs/cgroup/memory.max")
_CGROUP_V1 = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")


@attrs.frozen
class Limit:
    """A limit as configured: ``fraction`` of the available memory, or ``absolute`` bytes."""

    fraction: float | None = None
    absolute: int | None = None

    def bytes(self, available_memory: int) -> int:
        if self.absolute is not None:
            return self.absolute
        assert self.fraction is not None
        return int(self.fraction * available_memory)


def parse_limit(value: float | int | str, what: str) -> Limit:
    """A limit from a config value or a flag: a float (or a string with a decimal point) is a
    fraction, an integer or a size with a unit is absolute (``ValueError`` otherwise)."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: a fraction such as 0.4 or a size such as 512MiB, not {value!r}")
    if isinstance(value, float):
        return _fraction(value, what)
    if isinstance(value, int):
        return _absolute(value, what)
    text = value.strip()
    if _RELATIVE.fullmatch(text):
        return _fraction(float(text), what)
    match = _ABSOLUTE.fullmatch(text)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(
            f"{what}: a fraction such as 0.4 or a size such as 512MiB or 50MB, not {value!r}"
        )
    return _absolute(int(match.group(1)) * _UNITS[match.group(2)], what)


def _fraction(value: float, what: str) -> Limit:
    if not 0 <= value <= 100:
        raise ValueError(f"{what}: a fraction must be between 0 and 100, not {value}")
    return Limit(fraction=value)


def _absolute(value: int, what: str) -> Limit:
    if value < 0:
        raise ValueError(f"{what}: a size cannot be negative ({value})")
    return Limit(absolute=value)


def available_memory() -> int:
    """The machine's RAM, or the memory limit of this process's cgroup when that is lower."""
    total = os.sysconf("SC_PHYS_PAGES") * _PAGE_SIZE
    for path in (_CGROUP_V2, _CGROUP_V1):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            return int(text)
    return total


class ResidentSet:
    """This process's resident set size, read from Linux's ``/proc/self/statm``, kept open so
    that measuring needs no new file descriptor (they may be what ran out)."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)

    def bytes(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE_SIZE

    def in_use(self, limit: int) -> int:
        """The resident set; when that is over ``limit``, after the allocator has returned its
        free pages (freed messages), so that only memory still in use counts."""
        used = self.bytes()
        if used > limit and (trim := _malloc_trim()) is not None:
            trim(0)
            used = self.bytes()
        return used


@functools.cache
def _malloc_trim() -> Callable[[int], object] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], object] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return None
    return trim


def free_disk_bytes(path: Path) -> int:
    """Free space on the file system holding ``path`` (for an unprivileged user)."""
    return shutil.disk_usage(path).free
