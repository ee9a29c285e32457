"""The model of one classic queue behind ``tests/reliability/test_queue_model.py`` (a port of
RabbitMQ's ``classic_queue_prop_SUITE``), and the broker that test drives.

The model follows the broker's documented contract (``docs/architecture.md``,
``docs/storage-format.md``):

- the queue always delivers its oldest ready message: fresh messages in publish order, a requeued
  one back at its original position, flagged redelivered;
- a persistent message is *stored* once a confirm covered it or a later persistent publish was
  confirmed (group commit: one flush covers every record appended before it), or at a clean stop;
- a settlement (ack, reject, purge, auto-ack get) becomes durable lazily, with the next flush: the
  model counts it durable once a persistent publish sent after it was confirmed, or at a clean
  stop; until then a crash MAY bring the message back (flagged redelivered if it was delivered);
- after any restart transient messages are gone; after a crash (kill -9) stored unsettled
  messages come back, unstored or unsettled-durably ones may; a message that was never delivered
  may come back flagged redelivered (the delivery-reservation window), one that was delivered
  always comes back flagged.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker

READY, UNACKED, SETTLED = "ready", "unacked", "settled"


class ModelViolation(AssertionError):
    """The broker did something the model does not allow."""


def body_for(msg_id: int, size: int) -> bytes:
    """A message's body: its id repeated, cut to ``size`` (so a body is checked byte for byte)."""
    unit = msg_id.to_bytes(4, "big")
    return (unit * (size // 4 + 1))[:size]


@dataclass
class Msg:
    id: int
    size: int
    persistent: bool
    stored: bool = False  # on disk for a process crash (confirmed, covered, or recovered)
    state: str = READY
    delivered: bool = False  # delivered at least once: every later delivery is flagged
    flag_any: bool = False  # came back from a crash never delivered: either flag is allowed
    settle_durable: bool = False  # SETTLED, and the settlement survives a crash


class QueueModel:
    """What the queue holds, message by message, and what a delivery may be."""

    def __init__(self) -> None:
        self.msgs: dict[int, Msg] = {}
        self.next_id = 1

    def ready(self) -> list[int]:
        return sorted(i for i, m in self.msgs.items() if m.state == READY)

    def publish(self, size: int, persistent: bool) -> int:
        msg_id = self.next_id
        self.next_id += 1
        self.msgs[msg_id] = Msg(msg_id, size, persistent)
        return msg_id

    def confirmed(self, msg_id: int) -> None:
        """A publish's confirm arrived: a persistent one was flushed, and with it everything
        appended and every settlement made before it."""
        if not self.msgs[msg_id].persistent:
            return
        for m in self.msgs.values():
            if m.id <= msg_id:
                m.stored = True
            if m.state == SETTLED:
                m.settle_durable = True

    def check_delivery(self, msg_id: int, redelivered: bool) -> Msg:
        m = self.msgs.get(msg_id)
        if m is None or m.state != READY:
            state = "unknown" if m is None else m.state
            raise ModelViolation(f"message {msg_id} delivered while {state}")
        if m.delivered and not redelivered:
            raise ModelViolation(f"message {msg_id} redelivered without the redelivered flag")
        if not m.delivered and not m.flag_any and redelivered:
            raise ModelViolation(f"message {msg_id} never delivered before but flagged redelivered")
        return m

    def deliver(self, msg_id: int, redelivered: bool, *, settle: bool = False) -> None:
        m = self.check_delivery(msg_id, redelivered)
        m.delivered, m.flag_any = True, False
        m.state = UNACKED
        if settle:
            self.settle(msg_id)

    def settle(self, msg_id: int) -> None:
        m = self.msgs[msg_id]
        assert m.state == UNACKED, m
        m.state, m.settle_durable = SETTLED, False

    def requeue(self, msg_id: int) -> None:
        m = self.msgs[msg_id]
        assert m.state == UNACKED, m
        m.state = READY

    def purge(self) -> int:
        ready = self.ready()
        for i in ready:
            self.msgs[i].state, self.msgs[i].settle_durable = SETTLED, False
        return len(ready)

    def clean_restart(self) -> None:
        """A graceful stop (unacked deliveries requeued, everything flushed) and a start."""
        for i, m in list(self.msgs.items()):
            if not m.persistent or m.state == SETTLED:
                del self.msgs[i]
            else:
                m.state, m.stored = READY, True

    def crash(self) -> tuple[set[int], set[int]]:
        """kill -9: which messages must come back and which may (the rest must not)."""
        must: set[int] = set()
        may: set[int] = set()
        for i, m in self.msgs.items():
            if not m.persistent or (m.state == SETTLED and m.settle_durable):
                continue
            (must if m.state != SETTLED and m.stored else may).add(i)
        return must, may

    def recovered(self, present: set[int]) -> None:
        """After a crash: exactly ``present`` came back (ready, on disk)."""
        for i, m in list(self.msgs.items()):
            if i not in present:
                del self.msgs[i]
                continue
            m.state, m.stored = READY, True
            if not m.delivered:
                m.flag_any = True  # the reservation window: docs/storage-format.md


# A fork server: imports the broker once, then forks one ``tqbroker.cli.main`` per start (a
# start costs ~0.1 s instead of the ~0.6-1 s of a fresh interpreter). Each broker is still a
# process of its own, killed for real. Commands on stdin, one JSON line each: ["start", argv,
# log_path] answers "pid N" (then the broker prints its ready line, and "exited CODE" when its
# main returns: at once if it could not start); ["wait"] answers "exit N STATUS" once the
# running broker has exited.
_FORK_SERVER = """
import json, os, sys
import tqbroker.cli, tqbroker_rocksdb
from importlib.metadata import entry_points
for group in ("tqbroker.backends", "tqbroker.exchange_types"):
    entry_points(group=group)
pid = 0
for line in sys.stdin:
    command = json.loads(line)
    if command[0] == "start":
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(os.open(command[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                code = tqbroker.cli.main(command[1])
            finally:
                print("exited", code)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print("pid", pid, flush=True)
    elif command[0] == "wait":
        _pid, status = os.waitpid(pid, 0)
        print("exit", pid, os.waitstatus_to_exitcode(status), flush=True)
"""


class ForkServer:
    """Starts brokers as children of one long-lived process (``_FORK_SERVER``)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.pid = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("")

    def _send(self, *command: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def _line(self, prefix: str, timeout: float = 30) -> str:
        line = self.lines.get(timeout=timeout)
        if not line.startswith(prefix):
            raise RuntimeError(f"fork server: expected {prefix!r}, got {line!r}")
        return line

    def start(self, argv: list[str], log_path: Path, timeout: float = 30) -> int:
        """Start a broker; its AMQP port. A broker that exits (a port in use...) or stays silent
        for ``timeout`` seconds is killed and reaped, so that the next start begins afresh."""
        self._send("start", argv, str(log_path))
        self.pid = int(self._line("pid ").split()[1])
        try:
            ready = self.lines.get(timeout=timeout)
        except queue.Empty:
            ready = f"silent for {timeout} s"
        match = re.search(r"ready: listening on amqp://\S+?:(\d+)", ready)
        if match is None:
            self.signal(signal.SIGKILL)  # a zombie until wait() if it has exited already
            self.wait()
            log = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
            said = f"{ready!r}, its log ends {log[-1]!r}" if log else repr(ready)
            raise RuntimeError(f"the broker did not start ({said}): see {log_path}")
        return int(match.group(1))

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)  # the broker this fork server started

    def wait(self, timeout: float = 30) -> int:
        """Wait for the broker to exit; its exit status (skipping what it printed last: its
        "exited" line, or the ready line of one killed as it came up)."""
        self._send("wait")
        line = self.lines.get(timeout=timeout)
        while line and not line.startswith("exit "):
            line = self.lines.get(timeout=timeout)
        if not line:
            raise RuntimeError("fork server: exited")
        return int(line.split()[2])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class ModelBroker:
    """The broker of one test: in-process for the memory backend (no restarts), else a broker
    process (``ForkServer``), stopped with SIGTERM (clean) or SIGKILL (crash) and started again
    on the same data directory. Every queue the model declares names ``backend`` in
    ``x-queue-backend``."""

    def __init__(self, backend: str, data_dir: Path, server: ForkServer | None = None) -> None:
        self.backend = backend
        self.data_dir = data_dir
        self.restartable = backend != "memory"
        self.log_path = data_dir.parent / "broker.log"  # every run's log, appended
        data_dir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.starts = 0
        self.start_seconds = 0.0
        self.running = False
        self._stack = ExitStack()
        if self.restartable:
            self._server = server or self._stack.enter_context(closing(ForkServer()))
            self.start()
        else:
            config = BrokerConfig(port=0, data_dir=data_dir)
            self.port = self._stack.enter_context(running_broker(config)).port
            self.running = True

    def start(self) -> None:
        began = time.monotonic()
        # No HTTP API, no metrics port: their defaults (15672, 15692) are fixed ports, which
        # another broker on the machine (the other xdist worker's) may hold.
        argv = ["--port", "0", "--http-port", "-1", "--metrics-port", "-1"]
        argv += ["--data-dir", str(self.data_dir)]
        argv += ["--durable-backend", self.backend, "--log-level", "WARNING"]
        self.port = self._server.start(argv, self.log_path)
        self.running = True
        self.starts += 1
        self.start_seconds += time.monotonic() - began

    def connect(self) -> pika.BlockingConnection:
        params = pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0)
        return pika.BlockingConnection(params)

    def stop(self, pump: Callable[[], None]) -> None:
        """Graceful stop: SIGTERM, and ``pump`` the client's connection so that it answers the
        broker's ``connection.close`` (else the broker waits its shutdown timeout)."""
        self._server.signal(signal.SIGTERM)
        self.running = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                pump()
            except Exception:  # the broker closed the connection
                break
        status = self._server.wait()
        if status != 0:
            raise ModelViolation(f"the broker exited with status {status} on SIGTERM")

    def kill(self) -> None:
        self._server.signal(signal.SIGKILL)
        self.running = False
        self._server.wait()

    def close(self) -> None:
        if self.restartable and self.running:
            self._server.signal(signal.SIGTERM)
            self._server.wait()
        self._stack.close()


@dataclass
class Chan:
    """One of the machine's channels: its consumer and the deliveries it holds unacked."""

    ch: BlockingChannel
    confirm: bool
    consumer: str | None = None
    prefetch: int = 0  # 0: unlimited
    unacked: dict[int, tuple[int, str | None]] = field(default_factory=dict)  # tag: id, consumer

    def credit(self) -> float:
        if self.consumer is None:
            return 0
        if self.prefetch == 0:
            return float("inf")
        return self.prefetch - sum(1 for _i, c in self.unacked.values() if c == self.consumer)


def deliveries_by_consumer(batch: list[tuple[int, str, int]]) -> Iterator[list[int]]:
    """The ids each consumer received in one batch (``(channel, consumer tag, id)``)."""
    seen: dict[tuple[int, str], list[int]] = {}
    for channel, tag, msg_id in batch:
        seen.setdefault((channel, tag), []).append(msg_id)
    yield from seen.values()
