"""Pipelined topology work and what another client sees meanwhile: N ``queue.declare``, then N
``basic.consume``, pipelined on one connection, then that connection's close.

    python benchmarks/pipelined_topology.py [--queues 100000] [--durable] [--idle 6]
                                            [--tree PATH] [--profile DIR] [--json PATH]

A broker is started here (``python -m tqbroker`` on loopback, ephemeral ports, a temporary
data directory); ``--tree`` starts it from another checkout (its ``src``, backends and plugins
on the broker's ``PYTHONPATH``: the week-ago tree, say), this process's clients staying ours.
The phases, one after another:

- ``declare``: one connection sends N ``queue.declare`` (transient, or ``--durable``; no
  ``nowait``) without waiting, a thousand frames per ``sendall``, while it reads the N
  declare-oks;
- ``consume``: the same connection sends N ``basic.consume`` (one per queue, one channel) and
  reads the N consume-oks;
- ``idle``: ``--idle`` seconds with N queues and N consumers and nothing to do (the broker's
  periodic work: the stats sampler, the garbage collector);
- ``close``: ``connection.close`` until its close-ok (the N consumers cancelled), then 0.3 s
  more (what the broker still does once they are gone).

All along a canary process (a connection of its own, ``consumer_crowd.canary``) publishes a
message to its own queue and receives it back, over and over; each phase reports its duration,
the broker's CPU seconds (``/proc/<pid>/stat``), the canary's round trips and the longest of
them. ``--profile DIR``: py-spy records the broker during each phase (``DIR/<phase>.txt``,
collapsed stacks). A probe: it asserts nothing.

The issue's figures (main, 100k): another client's worst round trip 2.08 s during the declares
and 1.74 s during the close; 100k declares took 23 s of CPU (6.5 s a week before).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

from consumer_crowd import canary_process
from procstats import cpu_seconds, profiling
from rawclient import Endpoint, RawClient

from tqbroker.protocol.frames import FRAME_METHOD, encode_method
from tqbroker.protocol.methods import (
    BasicConsume,
    BasicConsumeOk,
    ConnectionClose,
    QueueDeclare,
    QueueDeclareOk,
)

FRAMES_PER_SEND = 1000
TIMEOUT = 600.0  # seconds any one phase may take
SETTLE_SECONDS = 0.3  # after the close-ok: what the broker still does


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    cpu_seconds: float  # the broker's
    trips: int  # the canary's round trips meanwhile
    longest: float  # the longest of them (s)


# -- the pipelining client -------------------------------------------------------------------


def _pipelined(client: RawClient, frames: list[bytes], reply_index: int) -> None:
    """Send ``frames`` (a thousand per ``sendall``) from a thread while this one reads as many
    replies (method frames whose class and method ids are ``reply_index``)."""
    chunks = [
        b"".join(frames[at : at + FRAMES_PER_SEND]) for at in range(0, len(frames), FRAMES_PER_SEND)
    ]
    sender = threading.Thread(target=_send_all, args=(client, chunks))
    sender.start()
    try:
        client.read_replies(len(frames), reply_index)
    finally:
        sender.join()


def _send_all(client: RawClient, chunks: list[bytes]) -> None:
    for chunk in chunks:
        client.sock.sendall(chunk)


# -- phases ----------------------------------------------------------------------------------


class Probe:
    def __init__(
        self, pid: int, canary_pipe: multiprocessing.connection.Connection, profile: Path | None
    ) -> None:
        self.pid = pid
        self.canary = canary_pipe
        self.profile = profile
        self.phases: list[Phase] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        recording = (
            profiling(self.pid, self.profile, "raw", name) if self.profile else nullcontext()
        )
        with recording:
            self.canary.send("mark")
            cpu = cpu_seconds(self.pid) or 0.0
            began = time.perf_counter()
            yield
            seconds = time.perf_counter() - began
            cpu = (cpu_seconds(self.pid) or 0.0) - cpu
            self.canary.send("report")
            trips, longest = self.canary.recv()
        self.phases.append(Phase(name, seconds, cpu, trips, longest))
        print(
            f"| {name} | {seconds:.2f} s | {cpu:.2f} s | {trips} | {longest * 1000:.1f} ms |",
            flush=True,
        )


def run_phases(probe: Probe, endpoint: Endpoint, queues: int, durable: bool, idle: float) -> None:
    client = RawClient.connect(endpoint, timeout=TIMEOUT)
    names = [f"topology-{n:06d}" for n in range(queues)]
    declares = [encode_method(1, QueueDeclare(queue=name, durable=durable)) for name in names]
    consumes = [
        encode_method(1, BasicConsume(queue=name, consumer_tag=f"t{n}"))
        for n, name in enumerate(names)
    ]
    with probe.phase("declare"):
        _pipelined(client, declares, QueueDeclareOk.INDEX)
    with probe.phase("consume"):
        _pipelined(client, consumes, BasicConsumeOk.INDEX)
    with probe.phase("idle"):
        time.sleep(idle)
    with probe.phase("close"):
        client.send(0, ConnectionClose(200, "bye", 0, 0))
        while client.read_frame()[0] != FRAME_METHOD:  # the close-ok
            pass
        client.sock.close()
        time.sleep(SETTLE_SECONDS)


# -- the broker ------------------------------------------------------------------------------


def _broker_env(tree: Path | None) -> dict[str, str]:
    """This environment, with ``tree``'s packages first on the path (None: as it is)."""
    env = dict(os.environ)
    if tree is not None:
        paths = [tree, tree / "src", tree / "backends" / "rocksdb" / "src"]
        paths += sorted((tree / "plugins").glob("*/src"))
        env["PYTHONPATH"] = ":".join(str(p) for p in paths if p.is_dir())
    return env


def start_broker(directory: Path, tree: Path | None) -> tuple[subprocess.Popen[str], str]:
    env = _broker_env(tree)
    command = [sys.executable, "-m", "tqbroker"]
    flags = ["--port", "0", "--http-port", "-1", "--data-dir", str(directory / "data")]
    flags += ["--log-level", "WARNING"]
    usage = subprocess.run([*command, "--help"], env=env, capture_output=True, text=True).stdout
    if "--metrics-port" in usage:  # an older tree has no metrics listener
        flags += ["--metrics-port", "-1"]
    proc = subprocess.Popen([*command, *flags], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # tqbroker X ready: listening on amqp://H:P, ...
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"the broker did not start: {line!r}")
    amqp = line.split("listening on ")[1].split(",")[0].strip()
    return proc, amqp.replace("amqp://", "amqp://guest:guest@") + "/"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=100_000, help="queues and consumers (N)")
    parser.add_argument("--durable", action="store_true", help="durable queues (log backend)")
    parser.add_argument("--idle", type=float, default=6.0, help="seconds of the idle phase")
    parser.add_argument("--tree", type=Path, help="start the broker from this checkout")
    parser.add_argument("--profile", type=Path, help="py-spy each phase into this directory")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tqbroker-topology-") as tmp:
        broker, url = start_broker(Path(tmp), args.tree)
        endpoint = Endpoint.from_url(url)
        try:
            with canary_process(endpoint) as ours:
                kind = "durable" if args.durable else "transient"
                tree = args.tree or "this tree"
                print(f"{args.queues} {kind} queues, broker from {tree}")
                print("| phase | seconds | broker CPU | canary round trips | canary longest |")
                print("|---|---|---|---|---|")
                probe = Probe(broker.pid, ours, args.profile)
                run_phases(probe, endpoint, args.queues, args.durable, args.idle)
                if args.json is not None:
                    document = {
                        "queues": args.queues,
                        "durable": args.durable,
                        "tree": str(tree),
                        "phases": [asdict(phase) for phase in probe.phases],
                    }
                    args.json.write_text(json.dumps(document, indent=2))
        finally:
            broker.terminate()
            try:
                broker.wait(120)
            except subprocess.TimeoutExpired:
                broker.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
