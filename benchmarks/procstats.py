"""What the operating system says about processes and the machine, for the benchmark suite.

Responsibilities:
- ``/proc`` probes: ``cpu_seconds(pid)`` (utime + stime, all threads), ``machine_cpu_seconds()``
  (so that CPU used by anything else during a run shows), ``memory(pid)`` (RSS and its
  anonymous/file parts), ``pid_listening_on(port)`` (which local process serves a port),
  ``comm(pid)`` and ``pids_named(name)`` (processes by name), ``tree_bytes(root)`` (disk use);
- the machine: what it is (``machine()``, for the JSON record) and how busy
  (``wait_for_idle``, under ``IDLE_LOAD``);
- ``profiling``: py-spy recording a process for the length of a ``with`` block.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

IDLE_LOAD = 0.5  # the 1-minute load average under which the machine counts as idle
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PROFILE_EXTENSIONS = {"flamegraph": "svg", "speedscope": "json", "raw": "txt"}


# -- processes ---------------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads); None if unknown/gone."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime: fields 14 and 15


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, all cores (``/proc/stat``: user,
    nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


@dataclass(frozen=True)
class Memory:
    """A process's resident memory, bytes: total, anonymous (heap) and file-backed parts."""

    rss: int
    anon: int
    file: int


def memory(pid: int) -> Memory:
    """Process ``pid``'s resident memory now."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            values[key] = int(rest.split()[0]) * 1024
    return Memory(values.get("VmRSS", 0), values.get("RssAnon", 0), values.get("RssFile", 0))


def pid_listening_on(port: int) -> int | None:
    """The local process with a TCP socket listening on ``port`` (None if not found or not
    ours to see): the socket's inode from ``/proc/net/tcp*``, then the ``/proc/*/fd`` holding
    it."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def pids_named(name: str) -> set[int]:
    return {
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and comm(int(p.name)) == name
    }


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# -- the machine -------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    """The host, platform, CPU model, cores, memory and Python version."""

    def first(path: str, prefix: str) -> str:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
        return "?"

    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory": first("/proc/meminfo", "MemTotal"),
        "python": platform.python_version(),
    }


def wait_for_idle(seconds: float, log: Callable[[str], None]) -> None:
    """Wait up to ``seconds`` for the 1-minute load average to fall under ``IDLE_LOAD``."""
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] > IDLE_LOAD and time.monotonic() < deadline:
        log(f"waiting for an idle machine (load average {os.getloadavg()[0]:.2f}) ...")
        time.sleep(min(30.0, max(deadline - time.monotonic(), 0.0)))


# -- py-spy ------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiling(pid: int, directory: Path, output_format: str, label: str) -> Iterator[None]:
    """py-spy records process ``pid`` while the block runs, into ``directory/label.<ext>`` (its
    own output appended to ``directory/py-spy.log``)."""
    output = directory / f"{label}.{_PROFILE_EXTENSIONS[output_format]}"
    command = [py_spy() or "py-spy", "record", "--pid", str(pid), "--rate", "250"]
    command += ["--nonblocking", "--threads", "--format", output_format, "-o", str(output)]
    with open(directory / "py-spy.log", "a") as spy_log:
        spy = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=spy_log, stderr=spy_log)
    try:
        time.sleep(1.0)  # attached and sampling
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def py_spy() -> str | None:
    """The py-spy beside this Python, or on the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")
