"""Node-to-node link benchmark: small requests per second with many in flight, and the
throughput of 64 KiB replies, over loopback TCP.

    python benchmarks/peer_link.py [--seconds 3] [--runs 3] [--in-flight 64]
                                   [--request-size 100] [--reply-size 65536]
                                   [--reply-in-flight 16] [--same-process]

Starts a ``PeerServer`` on 127.0.0.1 in a child process (``--same-process``: in this one, so
both ends share one core) whose handler answers at once, and one ``PeerClient`` (one
connection, as between two nodes). Each run has two phases of ``--seconds`` each:
``--in-flight`` tasks sending ``--request-size``-byte requests with small replies back to back
(requests per second, and the median and 99th percentile of a request's time), then
``--reply-in-flight`` tasks asking for ``--reply-size``-byte replies (MiB/s of reply bodies).
Prints each run and the medians. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from tqbroker.cluster.peer_link import (
    LinkSettings,
    PeerClient,
    PeerServer,
    connect_tcp,
    serve_tcp,
)

SECRET = b"b" * 32
MIB = 1024 * 1024


def make_server(reply_size: int) -> PeerServer:
    blob = b"x" * reply_size

    async def handler(peer_id: str, op: str, body: Any) -> Any:
        return blob if op == "blob" else len(body)

    return PeerServer("server", SECRET, handler, LinkSettings(max_in_flight=1024))


def serve(reply_size: int) -> None:
    """The child process: serve until killed, the port on the first line of stdout."""

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, make_server(reply_size), "127.0.0.1", 0)
            print(port, flush=True)

    trio.run(run)


async def drive(
    workers: int, seconds: float, call: Callable[[], Awaitable[object]]
) -> tuple[int, list[float]]:
    """``workers`` tasks calling ``call`` back to back for ``seconds``: calls and their times."""
    times: list[float] = []
    deadline = trio.current_time() + seconds

    async def worker() -> None:
        while trio.current_time() < deadline:
            started = time.perf_counter()
            await call()
            times.append(time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(worker)
    return len(times), times


async def one_run(port: int, args: argparse.Namespace) -> tuple[float, float, float, float]:
    settings = LinkSettings(max_in_flight=1024)
    async with PeerClient(
        "client", SECRET, connect_tcp("127.0.0.1", port), peer_id="server", settings=settings
    ) as client:
        small = b"r" * args.request_size
        await client.request("small", small)  # connected before the clock starts

        async def small_request() -> object:
            return await client.request("small", small)

        async def blob_request() -> object:
            return await client.request("blob", None)

        count, times = await drive(args.in_flight, args.seconds, small_request)
        rate = count / args.seconds
        p50 = statistics.median(times) * 1000
        p99 = statistics.quantiles(times, n=100)[98] * 1000
        count, _ = await drive(args.reply_in_flight, args.seconds, blob_request)
        throughput = count * args.reply_size / MIB / args.seconds
    return rate, p50, p99, throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--request-size", type=int, default=100)
    parser.add_argument("--reply-size", type=int, default=65536)
    parser.add_argument("--reply-in-flight", type=int, default=16)
    parser.add_argument("--same-process", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.serve:
        serve(args.reply_size)
        return
    results = []
    for run in range(args.runs):
        result = trio.run(same_process_run, args) if args.same_process else child_process_run(args)
        rate, p50, p99, throughput = result
        print(
            f"run {run + 1}: {rate:,.0f} requests/s ({args.in_flight} in flight, "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms); "
            f"{throughput:,.0f} MiB/s of {args.reply_size // 1024} KiB replies "
            f"({args.reply_in_flight} in flight)"
        )
        results.append(result)
    rates, p50s, p99s, throughputs = zip(*results, strict=True)
    where = "one process" if args.same_process else "server in a child process"
    print(f"medians over {args.runs} runs ({where}, loopback TCP):")
    print(f"  small requests ({args.request_size} B): {statistics.median(rates):10,.0f} /s")
    print(
        f"  request time p50 / p99:    {statistics.median(p50s):.2f} / "
        f"{statistics.median(p99s):.2f} ms"
    )
    print(
        f"  {args.reply_size // 1024} KiB replies:           "
        f"{statistics.median(throughputs):10,.0f} MiB/s"
    )


async def same_process_run(args: argparse.Namespace) -> tuple[float, float, float, float]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_tcp, make_server(args.reply_size), "127.0.0.1", 0)
        result = await one_run(port, args)
        nursery.cancel_scope.cancel()
    return result


def child_process_run(args: argparse.Namespace) -> tuple[float, float, float, float]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--reply-size", str(args.reply_size)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        return trio.run(one_run, port, args)
    finally:
        child.kill()
        child.wait(timeout=10)


if __name__ == "__main__":
    main()
