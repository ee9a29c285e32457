"""Stream benchmark: confirmed publish rate into a stream, and read rate from ``first``.

    python benchmarks/streams.py [--count 1000000] [--size 100] [--window 1000]

Starts a broker (a separate process, log backend, fsync batch), declares a stream queue,
publishes ``--count`` messages of ``--size`` bytes with a raw-socket client keeping ``--window``
publishes unconfirmed (a confirm comes once the message is fsync'd), then reads the whole stream
from ``x-stream-offset=first`` with one consumer (prefetch 1000, a ``multiple`` ack every 500).
Prints messages per second for both. The client is our own lean one (``rawclient.py``) so that
the numbers are the broker's. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rawclient import RawClient

from tqbroker.testing import start_broker_process

STREAM = "bench-stream"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tqbroker-bench-") as data_dir,
        start_broker_process(Path(data_dir), durable_backend="log") as broker,
    ):
        publisher = RawClient(broker.port)
        publisher.declare(STREAM, {"x-queue-type": "stream"})
        rate = publisher.publish_confirmed(STREAM, b"x" * args.size, args.count, window=args.window)
        print(f"stream publish, confirmed ({args.size} B, window {args.window}): {rate:,.0f} msg/s")
        reader = RawClient(broker.port)
        rate = reader.consume(STREAM, args.count, arguments={"x-stream-offset": "first"})
        print(f"stream read from first ({args.count:,} messages):     {rate:,.0f} msg/s")


if __name__ == "__main__":
    main()
