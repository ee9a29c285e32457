"""Storage benchmark: prints what the log backend achieves on this machine's disk.

    python benchmarks/storage.py [--dir PATH] [--messages N] [--queued N]

Reports (each against the machine's own limit where one exists):
- append MB/s of the log backend (records into segments, page cache) vs ``dd`` sequential writes
  with fdatasync on the same disk;
- fsyncs per second of the disk (append 1 KiB + fdatasync, one at a time);
- confirmed persistent msg/s through the broker: a raw-socket publisher with a window of 256
  unconfirmed messages, 1 KiB bodies, persistent, to a durable queue (group commit at work);
- unclean-recovery scan MB/s (a log reopened without its clean-shutdown marker, scanned whole);
- broker RSS per queued message with N (default 1M) persistent 1 KiB messages queued.
This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from rawclient import RawClient

from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.log import Log
from tqbroker.model import Message
from tqbroker.protocol.methods import (
    BasicProperties,
)
from tqbroker.testing import start_broker_process

BODY = b"x" * 1024


def dd_mb_per_s(directory: Path) -> float:
    target = directory / "dd.bin"
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=512", "conv=fdatasync"],
        capture_output=True,
        text=True,
    ).stderr
    target.unlink(missing_ok=True)
    match = re.search(r"copied, ([\d.]+) s", out)
    return 512 / float(match.group(1)) if match else float("nan")


def append_mb_per_s(directory: Path, count: int) -> float:
    backend = LogBackend()
    backend.open(directory / "append")
    store = backend.open_queue("/", "bench")
    message = Message("", "bench", BasicProperties(delivery_mode=2).encode(), BODY)
    start = time.perf_counter()
    for _ in range(count):
        store.push(message, True)
    work = backend.begin_flush()
    if work is not None:
        work()
    elapsed = time.perf_counter() - start
    size = sum(s.size for s in store.log.segments)
    backend.close()
    return size / elapsed / 1e6


def fsyncs_per_s(directory: Path, seconds: float = 2.0) -> float:
    fd = os.open(directory / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        os.write(fd, BODY)
        os.fdatasync(fd)
        count += 1
    os.close(fd)
    return count / (time.perf_counter() - start)


def recovery_mb_per_s(directory: Path, megabytes: int = 512) -> float:
    log_dir = directory / "recovery"
    log = Log(log_dir)
    log.open()
    message = Message("", "bench", b"\x00\x00", BODY * 4)
    for _ in range(megabytes * 1024 // 4):
        log.append(message, 1)
    work = log.sync_work()
    if work is not None:
        work()
    log.close(clean=False)
    size = sum(p.stat().st_size for p in log_dir.glob("*.log"))
    for p in log_dir.glob("*.index"):
        p.unlink()  # force the scan to rebuild the indexes too
    start = time.perf_counter()
    Log(log_dir).open(recovery_point=0)
    return size / (time.perf_counter() - start) / 1e6


# -- through the broker ----------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a temp dir)")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queued", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        dd = dd_mb_per_s(directory)
        append = append_mb_per_s(directory, args.messages)
        print(
            f"append (log backend):        {append:8.1f} MB/s   dd sequential: {dd:.1f} MB/s"
            f"   ratio {append / dd:.2f}"
        )
        print(f"fsyncs per second (disk):    {fsyncs_per_s(directory):8.0f}")
        print(f"unclean recovery scan:       {recovery_mb_per_s(directory):8.1f} MB/s")
        with start_broker_process(directory / "broker", durable_backend="log") as broker:
            publisher = RawClient(broker.port)
            publisher.declare("bench")
            rate = publisher.publish_confirmed("bench", BODY, args.messages)
            print(f"confirmed persistent msg/s:  {rate:8.0f}   (window 256, 1 KiB, fsync batch)")
            baseline = rss_kib(broker.proc.pid)
            publisher.publish_confirmed("bench", BODY, args.queued)
            queued = args.messages + args.queued
            grown = rss_kib(broker.proc.pid) - baseline
            print(
                f"RSS per queued message:      {grown * 1024 / args.queued:8.1f} bytes   "
                f"({queued} queued, RSS {rss_kib(broker.proc.pid) / 1024:.0f} MiB)"
            )


if __name__ == "__main__":
    main()
