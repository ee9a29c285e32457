"""Helpers for testing code against a real tqbroker.

- ``running_broker()``: a context manager that runs a broker in a background thread on an
  ephemeral port, for synchronous code (pika's BlockingConnection, kombu, Celery);
- ``start_broker(nursery)``: start a broker inside a Trio nursery you own;
- ``start_broker_process(data_dir)``: run ``python -m tqbroker`` in a child process (to kill it,
  restart it, or watch its memory), as a context manager that stops it on exit;
- the pytest plugin (``tqbroker.testing.pytest_plugin``, loaded automatically when tqbroker is
  installed) offers the fixtures ``tqbroker_broker`` (pytest-trio) and ``tqbroker_thread``;
- ``tqbroker.testing.fake_etcd.FakeEtcd``: the cluster's metadata store (etcd) in memory, on
  Trio's clock, for cluster simulations.
"""

from __future__ import annotations

import os
import queue
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO

import attrs
import trio

from ..broker.broker import Broker
from ..config import BrokerConfig
from ..server.listener import Listening, serve
from ..storage_env import StorageEnv


@attrs.frozen
class RunningBroker:
    host: str
    port: int
    http_port: int | None = None
    metrics_port: int | None = None
    broker: Broker | None = attrs.field(default=None, eq=False, repr=False)
    # Every address it listens on (amqps, HTTPS and Kafka's TLS port too, when the config has
    # ``[tls]``).
    listening: Listening | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    @property
    def http_url(self) -> str:
        """The HTTP API's base URL (``http://127.0.0.1:PORT``)."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """The metrics port's base URL (``http://127.0.0.1:PORT``)."""
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def kafka_bootstrap(self) -> str:
        """The Kafka listener's ``host:port`` (a Kafka client's ``bootstrap_servers``)."""
        assert self.listening is not None
        return _first(self.listening.kafka, "no Kafka listener")

    @property
    def kafka_tls_bootstrap(self) -> str:
        """The Kafka TLS listener's ``host:port`` (with a ``[tls]`` certificate)."""
        assert self.listening is not None
        return _first(self.listening.kafka_tls, "no Kafka TLS listener (no [tls] certificate?)")

    @classmethod
    def at(cls, listening: Listening) -> RunningBroker:
        host, port = listening.amqp[0]
        return cls(
            host,
            port,
            listening.http[0][1] if listening.http else None,
            listening.metrics[0][1] if listening.metrics else None,
            listening.broker,
            listening,
        )


def _first(addresses: list[tuple[str, int]], missing: str) -> str:
    assert addresses, missing
    host, port = addresses[0]
    return f"{host}:{port}"


DURABLE_BACKEND_ENV = "TQBROKER_TEST_DURABLE_BACKEND"


def durable_backend_for_tests() -> str:
    """The durable backend test brokers use: ``$TQBROKER_TEST_DURABLE_BACKEND`` or ``log``
    (so one test suite runs against every backend: ``nox -s "backends(backend='rocksdb')"``)."""
    return os.environ.get(DURABLE_BACKEND_ENV) or BrokerConfig().durable_backend


def _isolated(config: BrokerConfig | None, data_dir: str) -> BrokerConfig:
    """Port 0 by default (AMQP, HTTP and metrics), and a private data directory unless
    ``config`` names one: a test broker never reads or writes ``./tqbroker-data``. The durable
    backend follows ``durable_backend_for_tests()`` unless ``config`` chose one."""
    defaults = BrokerConfig()
    config = config or BrokerConfig(port=0)
    if config.http_port == defaults.http_port:
        config = attrs.evolve(config, http_port=0)
    if config.metrics_port == defaults.metrics_port:
        config = attrs.evolve(config, metrics_port=0)
    if config.kafka_port == defaults.kafka_port:
        config = attrs.evolve(config, kafka_port=0)
    if config.kafka_tls_port == defaults.kafka_tls_port:
        config = attrs.evolve(config, kafka_tls_port=0)
    if config.data_dir == defaults.data_dir:
        config = attrs.evolve(config, data_dir=Path(data_dir))
    if config.durable_backend == defaults.durable_backend:
        config = attrs.evolve(config, durable_backend=durable_backend_for_tests())
    return config


async def start_broker(
    nursery: trio.Nursery, config: BrokerConfig | None = None, *, env: StorageEnv | None = None
) -> RunningBroker:
    """Start a broker (port 0 unless ``config`` says otherwise) in ``nursery``, with a fresh
    temporary data directory unless ``config`` names one; its storage works through ``env``
    (None: the real file system)."""
    config = _isolated(config, tempfile.mkdtemp(prefix="tqbroker-test-"))
    listening = await nursery.start(
        lambda task_status: serve(config, env=env, task_status=task_status)
    )
    return RunningBroker.at(listening)


@contextmanager
def running_broker(
    config: BrokerConfig | None = None, *, env: StorageEnv | None = None
) -> Iterator[RunningBroker]:
    """Run a broker in a background thread for the duration of the ``with`` block (port 0 and
    a temporary data directory, removed afterwards, unless ``config`` says otherwise; its
    storage through ``env``, None: the real file system)."""
    with (
        tempfile.TemporaryDirectory(prefix="tqbroker-test-") as data_dir,
        _run_in_thread(_isolated(config, data_dir), env) as broker,
    ):
        yield broker


@contextmanager
def _run_in_thread(config: BrokerConfig, env: StorageEnv | None) -> Iterator[RunningBroker]:
    started: queue.Queue[RunningBroker | BaseException] = queue.Queue()
    stop: list[trio.Event] = []
    token: list[trio.lowlevel.TrioToken] = []

    async def main() -> None:
        shutdown = trio.Event()
        stop.append(shutdown)
        token.append(trio.lowlevel.current_trio_token())
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(
                lambda task_status: serve(
                    config, shutdown=shutdown, env=env, task_status=task_status
                )
            )
            started.put(RunningBroker.at(listening))

    def thread_main() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the waiting caller
            started.put(exc)

    thread = threading.Thread(target=thread_main, name="tqbroker", daemon=True)
    thread.start()
    result = started.get(timeout=30)
    if isinstance(result, BaseException):
        raise RuntimeError("the broker failed to start") from result
    try:
        yield result
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=token[0])
        thread.join(timeout=30)


# The line ``python -m tqbroker`` prints once it listens (``cli.run``): the first AMQP address,
# and the HTTP API's port.
_STARTUP_LINE = re.compile(r"ready: listening on amqp://(\S+?):(\d+)(?:,|$)")
_HTTP_PORT = re.compile(r"http://\S+?:(\d+)(?:,|$)")
_METRICS_PORT = re.compile(r"metrics http://\S+?:(\d+)/metrics(?:,|$)")
_KAFKA_PORT = re.compile(r"kafka \S+?:(\d+)(?:,|$)")


@attrs.frozen
class BrokerProcess:
    """``python -m tqbroker`` in a child process (``start_broker_process()``); as a context
    manager it stops the broker on exit (``stop()``, ``kill()`` if that times out)."""

    proc: subprocess.Popen[str]
    host: str
    port: int
    http_port: int | None = None
    metrics_port: int | None = None
    kafka_port: int | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def kafka_bootstrap(self) -> str:
        """The Kafka listener's ``host:port``."""
        assert self.kafka_port is not None, "no Kafka listener"
        return f"{self.host}:{self.kafka_port}"

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Ask for a graceful shutdown (SIGTERM, or ``signum``) and wait for the exit; returns
        the exit status (0 after a graceful shutdown). Does nothing more if it has exited."""
        self.proc.send_signal(signum)
        self.proc.communicate(timeout=timeout)  # also closes the pipes
        return self.proc.returncode

    def kill(self, timeout: float = 10) -> int:
        """Kill it (SIGKILL: a crash, nothing is flushed) and wait; returns the exit status."""
        return self.stop(signal.SIGKILL, timeout)

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            self.kill()


def _popen(
    args: list[str], cwd: Path | None, stderr: int | IO[str] | None, max_open_files: int | None
) -> subprocess.Popen[str]:
    def limit_files() -> None:
        if max_open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))

    return subprocess.Popen(
        args, cwd=cwd, stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=limit_files
    )


def start_broker_process(
    data_dir: Path | None,
    *,
    durable_backend: str | None = None,
    extra_args: Sequence[str] = (),
    stderr: Path | int | IO[str] | None = subprocess.DEVNULL,
    log_level: str | None = "WARNING",
    cwd: Path | None = None,
    timeout: float = 30,
    max_open_files: int | None = None,
) -> BrokerProcess:
    """Run ``python -m tqbroker --port 0`` and wait for its startup line. ``data_dir`` None is
    the CLI's default (``tqbroker-data`` in ``cwd``); ``durable_backend`` defaults to
    ``durable_backend_for_tests()``; ``log_level`` None is the CLI's default (INFO).
    ``stderr`` (the broker's log): DEVNULL, None (inherited), PIPE, an open file, or a path
    to append to. Raises ``RuntimeError`` with what the broker printed if it exits, prints
    something else or stays silent for ``timeout`` seconds. ``max_open_files``: the broker's
    descriptor limit (``RLIMIT_NOFILE``, soft and hard), as ``ulimit -n`` would set it."""
    args = [sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "0"]
    args += ["--metrics-port", "0", "--kafka-port", "0"]
    args += ["--durable-backend", durable_backend or durable_backend_for_tests()]
    if data_dir is not None:
        args += ["--data-dir", str(data_dir)]
    if log_level is not None:
        args += ["--log-level", log_level]
    args += extra_args
    if isinstance(stderr, Path):
        with open(stderr, "a") as log:
            proc = _popen(args, cwd, log, max_open_files)
    else:
        proc = _popen(args, cwd, stderr, max_open_files)
    assert proc.stdout is not None
    line = _first_line(proc.stdout, timeout)
    match = _STARTUP_LINE.search(line or "")
    if match is None:
        raise _startup_failure(proc, line, timeout, stderr)
    http = _HTTP_PORT.search(line or "")
    metrics = _METRICS_PORT.search(line or "")
    kafka = _KAFKA_PORT.search(line or "")
    return BrokerProcess(
        proc,
        match.group(1),
        int(match.group(2)),
        int(http.group(1)) if http else None,
        int(metrics.group(1)) if metrics else None,
        int(kafka.group(1)) if kafka else None,
    )


def _first_line(stream: IO[str], timeout: float) -> str | None:
    """The first line of ``stream`` ("" at end of file), or None if none came in time."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def _startup_failure(
    proc: subprocess.Popen[str], line: str | None, timeout: float, stderr: object
) -> RuntimeError:
    """Reap a broker that did not start (killed if still running) and say what it did."""
    if line is None:
        said = f"printed nothing within {timeout:g} s"
    else:
        said = f"printed {line.rstrip()!r}" if line else "printed nothing"
    try:
        status = f"exit status {proc.wait(timeout=5 if line == '' else 0.2)}"
    except subprocess.TimeoutExpired:
        status = "killed: still running"
        proc.kill()
    _out, err = proc.communicate(timeout=10)
    log = stderr.read_text() if isinstance(stderr, Path) else err
    message = f"the broker did not start: it {said} ({status})"
    return RuntimeError(f"{message}; its log:\n{log.rstrip()}" if log and log.strip() else message)


__all__ = [
    "BrokerProcess",
    "RunningBroker",
    "durable_backend_for_tests",
    "running_broker",
    "start_broker",
    "start_broker_process",
]
