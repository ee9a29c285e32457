"""tqbroker against RabbitMQ: the same workloads against both brokers in one run, one table.

    python benchmarks/suite.py [--rabbitmq auto|start|none] [--rabbitmq-url amqp://...]
                               [--runs 3] [--messages 200000] [--queued 1000000]
                               [--workloads publish-transient,consume,...] [--json out.json]
                               [--smoke]

Workloads (1 KiB bodies; the load comes from worker processes using the lean raw-socket client):
- publish-transient: one publisher, transient messages, no confirms, into one queue; timed until
  the queue holds them all;
- publish-persistent: one publisher, persistent messages to a durable queue, confirms with a
  window of 256 unconfirmed (tqbroker confirms after fsync);
- consume: one consumer drains a queue filled beforehand (prefetch 1000, ``multiple`` ack
  every 100);
- latency: a publisher at a fixed 2k msg/s stamps each body, a consumer takes the difference
  on arrival; p50 and p99 (the first quarter second is warm-up, left out);
- fanout: a fanout exchange bound to 4 queues, one consumer process per queue, one publisher
  (no confirms); deliveries per second;
- stream: confirmed publish into a stream (window 256), then one consumer reads it from
  ``x-stream-offset=first``;
- memory-durable: a fresh broker, RSS growth per message after N persistent messages queued
  on a durable queue; then kill -9 and restart on the same data: seconds until the queue answers
  with all N again, per GB of message bodies (unclean recovery);
- memory-transient: the same RSS growth with transient messages on a non-durable queue.

Responsibilities:
- targets: tqbroker started here (``python -m tqbroker``, log backend, fsync before confirm);
  RabbitMQ started here on loopback (a private node: its own port, data and log directories and
  node name, stopped afterwards), or any broker at an AMQP URL; each knows its broker process
  (CPU seconds, RSS), gives a fresh empty instance for the memory workloads and can crash and
  restart where it was started here;
- runs: every workload ``--runs`` times per target, targets interleaved run by run; per row the
  median run (the lower middle one for an even count), with that run's CPU figures;
- output: one table (workload | tqbroker | RabbitMQ | ratio | broker CPU | client CPU; CPU as
  seconds and as a share of one core over the run's wall time, so a reader sees who was the
  limit), and with ``--json`` every run, the machine, the versions and the load average.
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadgen import (
    BODY_SIZE,
    Consume,
    Job,
    Memory,
    PacedPublish,
    Publish,
    RunResult,
    cpu_seconds,
    memory,
    pid_listening_on,
    run_jobs,
)
from rawclient import BrokerError, Endpoint, RawClient, publish_frames

from tqbroker.testing import BrokerProcess, start_broker_process

IDLE_LOAD = 0.5  # the 1-minute load average under which the machine counts as idle
CLIENT_LIMIT = 0.8  # a load generator process busier than this may have been the limit
OTHER_LIMIT = 0.5  # more CPU than this (cores) outside broker and clients: a busy machine


@dataclass(frozen=True)
class Settings:
    runs: int = 3
    messages: int = 200_000  # per throughput run
    queued: int = 1_000_000  # the memory and recovery backlog
    body_size: int = BODY_SIZE
    window: int = 256  # unconfirmed publishes
    prefetch: int = 1000
    ack_every: int = 100
    fanout_queues: int = 4
    latency_rate: float = 2000.0
    latency_seconds: float = 10.0
    settle: float = 1.0  # seconds before reading RSS
    settle_window: float = 10.0  # RSS has settled when it fell < 1% over this many seconds
    settle_max: float = 180.0
    profile: str | None = None  # a directory: py-spy profiles of tqbroker, one per timed phase
    profile_format: str = "flamegraph"


SMOKE = Settings(
    runs=1,
    messages=2000,
    queued=2000,
    latency_seconds=1.0,
    settle=0.2,
    settle_window=0.5,
    settle_max=2.0,
)


# -- targets ---------------------------------------------------------------------------------


class Target:
    """A broker under test."""

    name: str
    endpoint: Endpoint
    pid: int | None = None  # the broker's OS process (CPU, RSS), when known
    notes: list[str]

    can_restart = False  # crash() and restart() work

    def fresh(self) -> contextlib.AbstractContextManager[Target]:
        """An empty broker of the same kind for a memory measurement (this one if it cannot)."""
        return contextlib.nullcontext(self)

    def crash(self) -> None:
        """kill -9 the broker (only where ``can_restart``: a broker started here)."""
        raise RuntimeError(f"{self.name} was not started here: it cannot be crashed")

    def restart(self) -> None:
        """Start the broker again on the same data after ``crash()`` (it may not be up yet)."""
        raise RuntimeError(f"{self.name} was not started here: it cannot be restarted")

    def after_restart(self) -> None:
        """Called once it answers again (finds the new process)."""

    def data_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        pass

    def version(self) -> str:
        client = RawClient.connect(self.endpoint, timeout=10)
        try:
            return client.server_version
        finally:
            client.close()


class TqbrokerTarget(Target):
    """``python -m tqbroker`` in a child process on the log backend (fsync before confirm)."""

    can_restart = True

    def __init__(self, root: Path, extra_args: list[str]) -> None:
        self.name = "tqbroker"
        self.root = root
        self.extra_args = extra_args
        self.notes = []
        self.process: BrokerProcess | None = None
        root.mkdir(parents=True, exist_ok=True)

    def start(self) -> TqbrokerTarget:
        self.process = start_broker_process(
            self.root / "data",
            durable_backend="log",
            extra_args=self.extra_args,
            stderr=self.root / "broker.log",
        )
        self.endpoint = Endpoint(self.process.host, self.process.port)
        self.pid = self.process.proc.pid
        return self

    @contextlib.contextmanager
    def fresh(self) -> Iterator[Target]:
        root = Path(tempfile.mkdtemp(prefix="fresh-", dir=self.root))
        target = TqbrokerTarget(root, self.extra_args).start()
        try:
            yield target
        finally:
            target.close()
            shutil.rmtree(root, ignore_errors=True)

    def crash(self) -> None:
        assert self.process is not None
        self.process.kill()

    def restart(self) -> None:
        self.start()

    def data_bytes(self) -> int | None:
        return _tree_bytes(self.root / "data")

    def close(self) -> None:
        if self.process is None:
            return
        try:
            self.process.stop(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process = None


class ExternalTarget(Target):
    """A broker someone else runs, at an AMQP URL (its process found by its port if local)."""

    def __init__(self, name: str, url: str, pid: int | None) -> None:
        self.name = name
        self.endpoint = Endpoint.from_url(url)
        self.notes = []
        self.pid = pid if pid is not None else _local_pid(self.endpoint)
        if self.pid is None:
            self.notes.append("its process is unknown: no broker CPU or memory figures")
        self.notes.append("memory is the growth of a running broker (not a fresh one)")
        self.notes.append("unclean recovery not measured (the suite did not start it)")


class RabbitMQTarget(Target):
    """A private RabbitMQ node on loopback: its own port, distribution port, node name, data
    (mnesia) and log directories under ``root``, a config with just the listener and the
    Debian defaults, no plugins; ``HOME`` there too, so the Erlang cookie is its own."""

    can_restart = True

    def __init__(self, root: Path, server: str, ctl: str, *, epmd: Epmd) -> None:
        self.name = "RabbitMQ"
        self.root = root
        self.server, self.ctl, self.epmd = server, ctl, epmd
        self.notes = []
        self.node = f"tqbench-{os.getpid()}-{root.name}@localhost"
        self.port = _free_port()
        self.endpoint = Endpoint("127.0.0.1", self.port)
        self.popen: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        (root / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users.guest = true\n"
        )
        (root / "enabled_plugins").write_text("[].\n")
        (root / "rabbitmq-env.conf").write_text("")
        self.env = dict(
            os.environ,
            HOME=str(root),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(_free_port()),
            RABBITMQ_MNESIA_BASE=str(root / "mnesia"),
            RABBITMQ_LOG_BASE=str(root / "log"),
            RABBITMQ_CONFIG_FILE=str(root / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(root / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(root / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(root / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(root / "rabbitmq.pid"),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )

    def start(self, timeout: float = 120.0) -> RabbitMQTarget:
        self._spawn()
        deadline = time.monotonic() + timeout
        while True:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"rabbitmq-server exited with {self.popen.returncode}; its output:\n"
                    + self._log_tail()
                )
            try:
                if self._ctl("await_startup", timeout=30).returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"RabbitMQ did not start within {timeout:g} s")
            time.sleep(0.5)
        self.after_restart()
        return self

    def _spawn(self) -> None:
        self.epmd.note_before_start()
        with open(self.root / "server.out", "ab") as out:
            self.popen = subprocess.Popen(
                [self.server],
                env=self.env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the suite, which stops the node
            )

    def _ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.ctl, "-n", self.node, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def after_restart(self) -> None:
        """Find the node's Erlang VM (``beam.smp``), whose CPU and RSS are the broker's."""
        out = self._ctl("eval", "os:getpid().").stdout.strip().strip('"')
        pid = int(out) if out.isdigit() else None
        if pid is None or not _comm(pid).startswith("beam"):
            raise RuntimeError(f"cannot find RabbitMQ's beam process (os:getpid() said {out!r})")
        self.pid = pid

    def _log_tail(self) -> str:
        try:
            return (self.root / "server.out").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    @contextlib.contextmanager
    def fresh(self) -> Iterator[Target]:
        root = Path(tempfile.mkdtemp(prefix="fresh-", dir=self.root.parent))
        target = RabbitMQTarget(root, self.server, self.ctl, epmd=self.epmd).start()
        try:
            yield target
        finally:
            target.close()
            shutil.rmtree(root, ignore_errors=True)

    def crash(self) -> None:
        assert self.pid is not None
        assert self.popen is not None
        os.kill(self.pid, signal.SIGKILL)  # the beam.smp this node runs in
        self.popen.wait(timeout=30)  # the rabbitmq-server script exits with it
        self.pid = None

    def restart(self) -> None:
        self._spawn()

    def data_bytes(self) -> int | None:
        return _tree_bytes(self.root / "mnesia")

    def close(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                self._ctl("stop", timeout=120)
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                if self.pid is not None and _comm(self.pid).startswith("beam"):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.kill()
                self.popen.wait()
        self.popen = None
        self.pid = None


class Epmd:
    """The Erlang port mapper that starting a node launches when none runs: stopped at the end
    (by its pid) if we caused it and no node is registered with it any more."""

    def __init__(self) -> None:
        self.before: set[int] | None = None

    def note_before_start(self) -> None:
        if self.before is None:
            self.before = _pids_named("epmd")

    def cleanup(self) -> None:
        if self.before is None:
            return
        ours = _pids_named("epmd") - self.before
        binary = shutil.which("epmd") or next(
            (str(p) for p in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None
        )
        if not ours or binary is None:
            return
        names = subprocess.run([binary, "-names"], capture_output=True, text=True, timeout=10)
        if any(line.startswith("name ") for line in names.stdout.splitlines()):
            return  # a node still uses it
        for pid in ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _pids_named(name: str) -> set[int]:
    return {
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _comm(int(p.name)) == name
    }


def _local_pid(endpoint: Endpoint) -> int | None:
    if endpoint.host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return pid_listening_on(endpoint.port)


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# -- measurements and workloads -----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str  # msg/s, ms, B/msg, s/GB
    higher_is_better: bool = True


@dataclass
class Measure:
    """One row's figure from one run on one target."""

    value: float
    wall: float  # seconds the figure was measured over
    broker_cpu: float | None  # broker CPU seconds during it
    client_cpu: float  # load generator CPU seconds during it
    detail: dict[str, float | int | str] = field(default_factory=dict)
    busiest_worker: float = 0.0  # the highest CPU share of one load generator process
    other_cpu: float = 0.0  # machine CPU seconds outside the broker and the load generator


Workload = Callable[[Target, Settings, str], dict[str, Measure]]


def _throughput(result: RunResult, messages: int) -> Measure:
    return Measure(
        messages / result.wall,
        result.wall,
        result.broker_cpu,
        result.client_cpu,
        {"messages": messages, "client_us_per_msg": 1e6 * result.client_cpu / messages},
        result.busiest_worker,
        result.other_cpu,
    )


def _run(target: Target, jobs: list[Job], s: Settings, label: str) -> RunResult:
    """``run_jobs`` against the target, under py-spy if ``--profile`` asks for it."""
    with _profiling(target, s, label):
        return run_jobs(target.endpoint, jobs, broker_pid=target.pid)


@contextlib.contextmanager
def _profiling(target: Target, s: Settings, label: str) -> Iterator[None]:
    """With ``--profile DIR``: py-spy records tqbroker's process while the workers run (not
    while queues are set up or filled), one file per timed phase in DIR."""
    if s.profile is None or target.name != "tqbroker" or target.pid is None:
        yield
        return
    extension = {"flamegraph": "svg", "speedscope": "json", "raw": "txt"}[s.profile_format]
    output = Path(s.profile) / f"{label}.{extension}"
    command = [_py_spy() or "py-spy", "record", "--pid", str(target.pid), "--rate", "250"]
    command += ["--nonblocking", "--threads", "--format", s.profile_format, "-o", str(output)]
    with open(Path(s.profile) / "py-spy.log", "a") as log:
        spy = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
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


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def _client(target: Target) -> Iterator[RawClient]:
    client = RawClient.connect(target.endpoint)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def _cleanup(target: Target, queues: list[str], exchanges: tuple[str, ...] = ()) -> Iterator[None]:
    """Delete the queues and exchanges afterwards, on a connection of its own (whatever
    happened: a failed run must not leave a backlog behind for the next)."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ConnectionError, BrokerError), _client(target) as client:
            for queue in queues:
                client.delete_queue(queue)
            for exchange in exchanges:
                client.delete_exchange(exchange)


def publish_transient(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.publish-transient.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=False)
        job = Publish(queue, s.messages, body_size=s.body_size, wait_queue=queue)
        result = _run(target, [job], s, f"publish_transient-{tag}")
    return {"publish_transient": _throughput(result, s.messages)}


def publish_persistent(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.publish-persistent.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=True)
        job = Publish(queue, s.messages, body_size=s.body_size, persistent=True, window=s.window)
        result = _run(target, [job], s, f"publish_persistent-{tag}")
    return {"publish_persistent": _throughput(result, s.messages)}


def consume(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.consume.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=False)
            client.publish(publish_frames(queue, b"x" * s.body_size), s.messages)
            client.wait_for_count(queue, s.messages)
        job = Consume(queue, s.messages, prefetch=s.prefetch, ack_every=s.ack_every)
        result = _run(target, [job], s, f"consume-{tag}")
    return {"consume": _throughput(result, s.messages)}


def latency(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.latency.{tag}"
    count = max(int(s.latency_rate * s.latency_seconds), 10)
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=False)
        jobs: list[Job] = [
            Consume(
                queue,
                count,
                prefetch=s.prefetch,
                ack_every=s.ack_every,
                subscribe_early=True,
                latency=True,
            ),
        ]
        jobs.append(PacedPublish(queue, count, s.latency_rate, body_size=s.body_size))
        result = _run(target, jobs, s, f"latency-{tag}")
    stamps = result.outcomes[0].latencies_ns
    assert stamps is not None
    warmup = min(int(s.latency_rate / 4), len(stamps) // 10)
    samples = sorted(stamps[warmup:])
    publisher = result.outcomes[1]
    detail: dict[str, float | int | str] = {
        "samples": len(samples),
        "max_ms": samples[-1] / 1e6,
        "mean_ms": sum(samples) / len(samples) / 1e6,
        "sent_rate": publisher.messages / (publisher.finished - publisher.started),
    }
    return {
        key: Measure(
            _percentile(samples, p) / 1e6,
            result.wall,
            result.broker_cpu,
            result.client_cpu,
            detail,
            other_cpu=result.other_cpu,
        )
        for key, p in (("latency_p50", 0.50), ("latency_p99", 0.99))
    }


def _percentile(ordered: list[int], p: float) -> float:
    """Nearest rank."""
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)]


def fanout(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    exchange = f"bench.fanout.{tag}"
    queues = [f"bench.fanout.{tag}.{i}" for i in range(s.fanout_queues)]
    with _cleanup(target, queues, (exchange,)):
        with _client(target) as client:
            client.exchange_declare(exchange, "fanout")
            for queue in queues:
                client.declare(queue, durable=False)
                client.bind(queue, exchange)
        jobs: list[Job] = [
            Consume(q, s.messages, prefetch=s.prefetch, ack_every=s.ack_every, subscribe_early=True)
            for q in queues
        ]
        jobs.append(Publish("", s.messages, exchange=exchange, body_size=s.body_size))
        result = _run(target, jobs, s, f"fanout-{tag}")
    return {"fanout": _throughput(result, s.messages * len(queues))}


def stream(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.stream.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, {"x-queue-type": "stream"}, durable=True)
        publish = Publish(
            queue, s.messages, body_size=s.body_size, persistent=True, window=s.window
        )
        published = _run(target, [publish], s, f"stream_publish-{tag}")
        read = Consume(
            queue,
            s.messages,
            prefetch=s.prefetch,
            ack_every=s.ack_every,
            arguments={"x-stream-offset": "first"},
        )
        result = _run(target, [read], s, f"stream_read-{tag}")
    return {
        "stream_publish": _throughput(published, s.messages),
        "stream_read": _throughput(result, s.messages),
    }


def memory_durable(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    return _memory(target, s, tag, durable=True)


def memory_transient(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    return _memory(target, s, tag, durable=False)


def _memory(target: Target, s: Settings, tag: str, *, durable: bool) -> dict[str, Measure]:
    """RSS growth per queued message on a fresh broker; after the durable backlog, unclean
    recovery."""
    kind = "durable" if durable else "transient"
    queue = f"bench.memory.{kind}"
    out: dict[str, Measure] = {}
    with target.fresh() as broker, _cleanup(broker, [queue]):
        if broker.pid is None:
            raise RuntimeError("the broker's process is unknown: no RSS to read")
        with _client(broker) as client:
            client.declare(queue, durable=durable)
        time.sleep(s.settle)
        before = memory(broker.pid)
        job = Publish(queue, s.queued, body_size=s.body_size, persistent=durable, window=s.window)
        result = _run(broker, [job], s, f"memory_{kind}-{tag}")
        peak = memory(broker.pid)
        after, settled = _settled_memory(broker.pid, s)
        out[f"memory_{kind}"] = Measure(
            (after.rss - before.rss) / s.queued,
            result.wall,
            result.broker_cpu,
            result.client_cpu,
            {
                "queued": s.queued,
                "rss_before": before.rss,
                "rss_after": after.rss,
                "rss_right_after_fill": peak.rss,
                "settle_seconds": settled,
                "anon_per_msg": (after.anon - before.anon) / s.queued,
                "file_per_msg": (after.file - before.file) / s.queued,
                "fill_rate": s.queued / result.wall,
            },
            other_cpu=result.other_cpu,
        )
        if durable and broker.can_restart:
            out["recovery"] = _recovery(broker, queue, s)
    return out


def _settled_memory(pid: int, s: Settings) -> tuple[Memory, float]:
    """RSS once it stops falling (an Erlang VM gives memory back over tens of seconds after a
    burst, as its processes hibernate and its allocators free carriers): sampled every second
    until it fell less than 1% over ``settle_window`` seconds (at most ``settle_max``); the
    sample and the seconds waited."""
    start = time.perf_counter()
    time.sleep(s.settle)
    samples = [(time.perf_counter(), memory(pid))]
    while time.perf_counter() - start < s.settle_max:
        time.sleep(min(1.0, s.settle_window))
        now = time.perf_counter()
        samples.append((now, memory(pid)))
        earlier = [m.rss for t, m in samples if now - t >= s.settle_window]
        if earlier and samples[-1][1].rss > 0.99 * min(earlier):
            break
    return min((m for _t, m in samples), key=lambda m: m.rss), time.perf_counter() - start


def _recovery(broker: Target, queue: str, s: Settings) -> Measure:
    """kill -9, start again on the same data, and time until a passive declare of the queue
    answers with the whole backlog."""
    on_disk = broker.data_bytes()
    broker.crash()
    cpu, start = time.process_time(), time.perf_counter()
    broker.restart()
    deadline, last = start + 1800.0, "no answer"
    while True:
        try:
            with _client(broker) as client:
                count = client.message_count(queue)
            if count >= s.queued:
                break
            last = f"{count} messages"
        except (OSError, ConnectionError, BrokerError) as exc:
            last = repr(exc)
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the queue did not come back with {s.queued} messages: {last}")
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    client_cpu = time.process_time() - cpu
    broker.after_restart()
    gigabytes = s.queued * s.body_size / 1e9
    detail: dict[str, float | int | str] = {
        "seconds": seconds,
        "backlog_bytes": s.queued * s.body_size,
    }
    if on_disk is not None:
        detail["on_disk_bytes"] = on_disk
    # A new process: all its CPU so far went into starting and recovering.
    return Measure(seconds / gigabytes, seconds, cpu_seconds(broker.pid), client_cpu, detail)


ROWS = [
    Row("publish_transient", "publish, transient, no confirms (1 publisher)", "msg/s"),
    Row("publish_persistent", "publish, persistent, confirms (window 256)", "msg/s"),
    Row("consume", "consume (prefetch 1000, ack every 100, multiple)", "msg/s"),
    Row("latency_p50", "end-to-end latency at 2k msg/s, p50 *", "ms", False),
    Row("latency_p99", "end-to-end latency at 2k msg/s, p99 *", "ms", False),
    Row("fanout", "fanout to 4 queues, 4 consumers (deliveries)", "msg/s"),
    Row("stream_publish", "stream publish, confirms (window 256)", "msg/s"),
    Row("stream_read", "stream read from first", "msg/s"),
    Row("memory_durable", "memory per queued message, durable *", "B/msg", False),
    Row("memory_transient", "memory per queued message, transient *", "B/msg", False),
    Row("recovery", "unclean recovery (kill -9) per GB of backlog *", "s/GB", False),
]

WORKLOADS: dict[str, Workload] = {
    "publish-transient": publish_transient,
    "publish-persistent": publish_persistent,
    "consume": consume,
    "latency": latency,
    "fanout": fanout,
    "stream": stream,
    "memory-durable": memory_durable,
    "memory-transient": memory_transient,
}


# -- running and reporting -----------------------------------------------------------------------


@dataclass
class Results:
    """Every run's measures and errors, per target and row."""

    measures: dict[str, dict[str, list[Measure]]] = field(default_factory=dict)
    errors: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def add(self, target: str, measures: dict[str, Measure]) -> None:
        for key, measure in measures.items():
            self.measures.setdefault(target, {}).setdefault(key, []).append(measure)

    def fail(self, target: str, workload: str, error: str) -> None:
        self.errors.setdefault(target, {}).setdefault(workload, []).append(error)

    def median(self, target: str, key: str) -> Measure | None:
        """The median run (the lower middle one for an even count)."""
        runs = sorted(self.measures.get(target, {}).get(key, []), key=lambda m: m.value)
        return runs[(len(runs) - 1) // 2] if runs else None


def run_suite(
    targets: list[Target], workloads: list[str], s: Settings, log: Callable[[str], None]
) -> Results:
    results = Results()
    for name in workloads:
        for run in range(s.runs):
            for target in targets:
                log(f"{name}: run {run + 1}/{s.runs} on {target.name} ...")
                started = time.perf_counter()
                try:
                    measures = WORKLOADS[name](target, s, f"{run}")
                except Exception as exc:  # reported; the suite goes on
                    results.fail(target.name, name, f"{type(exc).__name__}: {exc}")
                    log(f"  failed: {type(exc).__name__}: {exc}")
                    continue
                results.add(target.name, measures)
                took = time.perf_counter() - started
                shown = ", ".join(
                    f"{key} {_format(m.value, _row(key).unit)}" for key, m in measures.items()
                )
                log(f"  {shown} ({took:.1f} s)")
    return results


def _row(key: str) -> Row:
    return next(row for row in ROWS if row.key == key)


def _format(value: float, unit: str) -> str:
    if unit == "msg/s":
        return f"{value / 1000:.1f}k msg/s" if value >= 1000 else f"{value:.0f} msg/s"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "B/msg":
        return f"{value:,.0f} B"
    return f"{value:.2f} {unit}"


def _cpu(seconds: float | None, wall: float) -> str:
    if seconds is None:
        return "?"
    shown = f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    return f"{shown} {100 * seconds / wall:.0f}%" if wall > 0 else shown


def table(results: Results, targets: list[Target], workloads: list[str]) -> str:
    """The Markdown table of medians; with two targets, the ratio first/second."""
    rows_run = {key for name in workloads for key in _rows_of(name)}
    names = [t.name for t in targets]
    header = ["workload", *names]
    if len(names) == 2:
        header.append("ratio")
    joined = " / ".join(names)
    header += [f"broker CPU ({joined})", f"client CPU ({joined})"]
    lines = [header]
    for row in ROWS:
        if row.key not in rows_run:
            continue
        medians = [results.median(name, row.key) for name in names]
        cells = [row.label]
        for name, median in zip(names, medians, strict=True):
            if median is not None:
                cells.append(_format(median.value, row.unit))
            elif any(results.errors.get(name, {}).values()) and _failed(results, name, row.key):
                cells.append("error")
            else:
                cells.append("n/a")
        if len(names) == 2:
            first, second = medians
            if first is not None and second is not None and second.value:
                cells.append(f"{first.value / second.value:.2f}")
            else:
                cells.append("-")
        cells.append(" / ".join(_cpu(m.broker_cpu, m.wall) if m else "-" for m in medians))
        cells.append(" / ".join(_cpu(m.client_cpu, m.wall) if m else "-" for m in medians))
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for i, line in enumerate(lines):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def _rows_of(workload: str) -> list[str]:
    return {
        "publish-transient": ["publish_transient"],
        "publish-persistent": ["publish_persistent"],
        "consume": ["consume"],
        "latency": ["latency_p50", "latency_p99"],
        "fanout": ["fanout"],
        "stream": ["stream_publish", "stream_read"],
        "memory-durable": ["memory_durable", "recovery"],
        "memory-transient": ["memory_transient"],
    }[workload]


def _failed(results: Results, target: str, key: str) -> bool:
    return any(key in _rows_of(w) for w in results.errors.get(target, {}))


def machine() -> dict[str, object]:
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
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] > IDLE_LOAD and time.monotonic() < deadline:
        log(f"waiting for an idle machine (load average {os.getloadavg()[0]:.2f}) ...")
        time.sleep(min(30.0, max(deadline - time.monotonic(), 0.0)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rabbitmq",
        choices=["auto", "start", "none"],
        default="auto",
        help="start a private RabbitMQ node on loopback: auto (if installed), start, none",
    )
    parser.add_argument("--rabbitmq-url", help="compare with the broker at this AMQP URL instead")
    parser.add_argument("--rabbitmq-pid", type=int, help="its process (found by port if local)")
    parser.add_argument(
        "--rabbitmq-server",
        default=_rabbit_script("rabbitmq-server"),
        help="the rabbitmq-server script (bypassing Debian's wrapper that switches user)",
    )
    parser.add_argument("--rabbitmqctl", default=_rabbit_script("rabbitmqctl"))
    parser.add_argument("--tqbroker-url", help="use this running tqbroker instead of starting one")
    parser.add_argument("--tqbroker-pid", type=int, help="its process (found by port if local)")
    parser.add_argument(
        "--tqbroker-arg",
        action="append",
        default=[],
        help="an argument for python -m tqbroker (repeatable): --tqbroker-arg=--fsync=never",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, from: {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one run: does it work")
    parser.add_argument("--runs", type=int, help="runs per workload and broker (median reported)")
    parser.add_argument("--messages", type=int, help="messages per throughput run (200,000)")
    parser.add_argument("--queued", type=int, help="messages queued for memory/recovery (1M)")
    parser.add_argument("--body-size", type=int, help="message body bytes (1024)")
    parser.add_argument("--latency-seconds", type=float, help="length of the latency run (10)")
    parser.add_argument("--latency-rate", type=float, help="msg/s of the latency run (2000)")
    parser.add_argument("--json", type=Path, help="write every run and the machine here")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=f"first wait up to this long for the load average to fall under {IDLE_LOAD}",
    )
    parser.add_argument("--dir", type=Path, help="where brokers keep their data (a temp dir)")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record tqbroker with py-spy during every timed phase, one file each in DIR",
    )
    parser.add_argument(
        "--profile-format", choices=["flamegraph", "speedscope", "raw"], default="flamegraph"
    )
    args = parser.parse_args(argv)

    settings = SMOKE if args.smoke else Settings()
    overrides: dict[str, object] = {
        "runs": args.runs,
        "messages": args.messages,
        "queued": args.queued,
        "body_size": args.body_size,
        "latency_seconds": args.latency_seconds,
        "latency_rate": args.latency_rate,
    }
    if args.profile is not None:
        if _py_spy() is None:
            parser.error("--profile needs py-spy (pip install py-spy)")
        args.profile.mkdir(parents=True, exist_ok=True)
        overrides["profile"] = str(args.profile.resolve())
        overrides["profile_format"] = args.profile_format
    settings = Settings(**{**asdict(settings), **{k: v for k, v in overrides.items() if v}})
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.wait_idle:
        wait_for_idle(args.wait_idle, log)
    load_before = os.getloadavg()
    if load_before[0] > IDLE_LOAD:
        log(f"warning: load average {load_before[0]:.2f}: the machine is not idle")

    epmd = Epmd()
    targets: list[Target] = []
    with tempfile.TemporaryDirectory(prefix="tqbroker-suite-", dir=args.dir) as tmp:
        root = Path(tmp)
        try:
            if args.tqbroker_url:
                targets.append(ExternalTarget("tqbroker", args.tqbroker_url, args.tqbroker_pid))
            else:
                targets.append(TqbrokerTarget(root / "tqbroker", args.tqbroker_arg).start())
            if args.rabbitmq_url:
                targets.append(ExternalTarget("RabbitMQ", args.rabbitmq_url, args.rabbitmq_pid))
            elif args.rabbitmq != "none":
                found = args.rabbitmq_server and shutil.which(args.rabbitmq_server)
                if found and args.rabbitmqctl and shutil.which(args.rabbitmqctl):
                    log("starting RabbitMQ on loopback ...")
                    targets.append(
                        RabbitMQTarget(
                            root / "rabbitmq", found, args.rabbitmqctl, epmd=epmd
                        ).start()
                    )
                elif args.rabbitmq == "start":
                    parser.error("--rabbitmq start: rabbitmq-server or rabbitmqctl not found")
                else:
                    log("RabbitMQ is not installed: tqbroker alone")
            versions = {t.name: t.version() for t in targets}
            log("; ".join(f"{name}: {v}" for name, v in versions.items()))
            results = run_suite(targets, workloads, settings, log)
        finally:
            for target in targets:
                target.close()
            epmd.cleanup()

    print(table(results, targets, workloads))
    notes = [
        "medians of "
        f"{settings.runs} run(s); {settings.body_size} B bodies; "
        f"CPU: seconds (share of one core over the run)",
    ]
    if len(targets) == 2:
        notes.append(f"ratio = {targets[0].name} / {targets[1].name}")
    notes.append("* lower is better")
    for target in targets:
        notes += [f"{target.name}: {note}" for note in target.notes]
    for row in ROWS:
        for target in targets:
            median = results.median(target.name, row.key)
            if median is None:
                continue
            if median.busiest_worker > CLIENT_LIMIT:
                notes.append(
                    f"{target.name} {row.key}: a load generator process was busy "
                    f"{100 * median.busiest_worker:.0f}% of a core: it may have set the pace"
                )
            if median.wall > 0 and median.other_cpu / median.wall > OTHER_LIMIT:
                notes.append(
                    f"{target.name} {row.key}: {100 * median.other_cpu / median.wall:.0f}% of "
                    "a core went to other processes or the kernel meanwhile: a busy machine?"
                )
    for name, failures in results.errors.items():
        for workload, errors in failures.items():
            notes += [f"{name} {workload} failed: {error}" for error in errors]
    print("\n".join(notes))

    if args.json:
        record = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "settings": asdict(settings),
            "workloads": workloads,
            "targets": {
                t.name: {"version": versions[t.name], "url": t.endpoint.url, "notes": t.notes}
                for t in targets
            },
            "rows": [
                {
                    **asdict(row),
                    "results": {
                        t.name: {
                            "median": _median_value(results, t.name, row.key),
                            "runs": [
                                asdict(m) for m in results.measures.get(t.name, {}).get(row.key, [])
                            ],
                        }
                        for t in targets
                    },
                }
                for row in ROWS
                if any(row.key in _rows_of(w) for w in workloads)
            ],
            "errors": results.errors,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 1 if results.errors else 0


def _median_value(results: Results, target: str, key: str) -> float | None:
    median = results.median(target, key)
    return median.value if median else None


def _rabbit_script(name: str) -> str | None:
    direct = Path("/usr/lib/rabbitmq/bin") / name
    return str(direct) if direct.exists() else shutil.which(name)


if __name__ == "__main__":
    sys.exit(main())
