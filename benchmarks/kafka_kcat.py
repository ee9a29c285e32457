"""The Kafka listener driven by Debian's kcat (librdkafka, C: the fastest client here), for a
broker of any checkout, so that two trees can be compared with the same client.

    python benchmarks/kafka_kcat.py [--count 500000] [--tree PATH] [--reads 2]

Starts ``python -m tqbroker`` from ``--tree`` (default: this checkout; log backend, fsync per
group commit, ephemeral ports), makes a one-partition topic, produces ``--count`` records of
100 B with ``kcat -P`` (``acks=all``: answered once fsync'd; 1 MB batches, ``linger.ms=5``),
then reads them all from the beginning ``--reads`` times with ``kcat -C``. Prints records per
second and the broker's CPU per record (user + system, all threads, from ``/proc``). Needs
``kcat`` on the PATH. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from procstats import cpu_seconds

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500_000)
    parser.add_argument("--tree", type=Path, default=HERE)
    parser.add_argument("--reads", type=int, default=2)
    args = parser.parse_args()
    tree, count = args.tree.resolve(), args.count
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'src'}")
    with tempfile.TemporaryDirectory(prefix="tqbroker-bench-") as data_dir:
        command = [sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "0"]
        command += ["--metrics-port", "0", "--kafka-port", "0", "--data-dir", data_dir]
        command += ["--log-level", "WARNING", "--durable-backend", "log"]
        broker = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert broker.stdout is not None
            line = broker.stdout.readline()
            http = re.search(r"http://\S+?:(\d+)", line)
            kafka = re.search(r"kafka \S+?:(\d+)", line)
            if http is None or kafka is None:
                raise RuntimeError(f"no HTTP or Kafka port in {line!r}")
            bootstrap = f"127.0.0.1:{kafka.group(1)}"
            created = httpx.put(
                f"http://127.0.0.1:{http.group(1)}/topics/bench",
                json={"partitions": 1},
                auth=("guest", "guest"),
            )
            created.raise_for_status()
            produce = ["kcat", "-P", "-b", bootstrap, "-t", "bench", "-p", "0"]
            produce += ["-X", "acks=all", "-X", "linger.ms=5", "-X", "batch.size=1000000"]
            produce += ["-X", "queue.buffering.max.messages=1000000"]
            produce += ["-X", "enable.idempotence=false"]
            records = (b"x" * 99 + b"\n") * count
            rate, cpu = timed(broker.pid, count, produce, records)
            print(f"{tree}: produce {rate:,.0f} rec/s, broker {cpu:.2f} µs/rec")
            fetch = ["kcat", "-C", "-b", bootstrap, "-t", "bench", "-p", "0", "-o", "beginning"]
            fetch += ["-e", "-c", str(count), "-q", "-f", ""]
            fetch += ["-X", "fetch.max.bytes=52428800", "-X", "max.partition.fetch.bytes=10485760"]
            for _ in range(args.reads):
                rate, cpu = timed(broker.pid, count, fetch, None)
                print(f"{tree}: fetch {rate:,.0f} rec/s, broker {cpu:.2f} µs/rec")
        finally:
            broker.terminate()
            broker.wait(30)


def timed(pid: int, count: int, command: list[str], stdin: bytes | None) -> tuple[float, float]:
    """Run ``command``: records per second, and the broker's µs of CPU per record."""
    cpu, start = cpu_seconds(pid) or 0.0, time.perf_counter()
    subprocess.run(command, input=stdin, check=True, stdout=subprocess.DEVNULL, timeout=600)
    elapsed = time.perf_counter() - start
    return count / elapsed, ((cpu_seconds(pid) or 0.0) - cpu) / count * 1e6


if __name__ == "__main__":
    main()
