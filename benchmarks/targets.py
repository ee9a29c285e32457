"""The brokers under test in the benchmark suite, and the processes they run in.

Responsibilities:
- ``TqbrokerTarget``: ``python -m tqbroker`` started here on the log backend (fsync before
  confirm);
- ``RabbitMQTarget``: a private RabbitMQ node started here on loopback (its own port, data and
  log directories and node name, stopped afterwards), and ``Epmd``, the Erlang port mapper it
  may launch, stopped at the end if we caused it;
- ``ExternalTarget``: any broker at an AMQP URL;
- each knows its broker process (CPU seconds, RSS), gives a fresh empty instance for the memory
  workloads and can crash and restart where it was started here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from procstats import comm, pid_listening_on, pids_named, tree_bytes
from rawclient import Endpoint, RawClient

from tqbroker.testing import BrokerProcess, start_broker_process


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

    def fresh(self) -> contextlib.AbstractContextManager[Target]:
        return _started_in(self.root, lambda root: TqbrokerTarget(root, self.extra_args).start())

    def crash(self) -> None:
        assert self.process is not None
        self.process.kill()

    def restart(self) -> None:
        self.start()

    def data_bytes(self) -> int | None:
        return tree_bytes(self.root / "data")

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
        if pid is None or not comm(pid).startswith("beam"):
            raise RuntimeError(f"cannot find RabbitMQ's beam process (os:getpid() said {out!r})")
        self.pid = pid

    def _log_tail(self) -> str:
        try:
            return (self.root / "server.out").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def fresh(self) -> contextlib.AbstractContextManager[Target]:
        return _started_in(
            self.root.parent,
            lambda root: RabbitMQTarget(root, self.server, self.ctl, epmd=self.epmd).start(),
        )

    def crash(self) -> None:
        assert self.pid is not None
        assert self.popen is not None
        os.kill(self.pid, signal.SIGKILL)  # the beam.smp this node runs in
        self.popen.wait(timeout=30)  # the rabbitmq-server script exits with it
        self.pid = None

    def restart(self) -> None:
        self._spawn()

    def data_bytes(self) -> int | None:
        return tree_bytes(self.root / "mnesia")

    def close(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                self._ctl("stop", timeout=120)
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                if self.pid is not None and comm(self.pid).startswith("beam"):
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
            self.before = pids_named("epmd")

    def cleanup(self) -> None:
        if self.before is None:
            return
        ours = pids_named("epmd") - self.before
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


def rabbit_script(name: str) -> str | None:
    """Where RabbitMQ's script ``name`` is: the one Debian's wrapper (which switches user) runs,
    else on the PATH."""
    direct = Path("/usr/lib/rabbitmq/bin") / name
    return str(direct) if direct.exists() else shutil.which(name)


@contextlib.contextmanager
def _started_in(parent: Path, start: Callable[[Path], Target]) -> Iterator[Target]:
    """A broker ``start``ed in a new directory under ``parent``: closed and its directory
    removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="fresh-", dir=parent))
    target = start(root)
    try:
        yield target
    finally:
        target.close()
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _local_pid(endpoint: Endpoint) -> int | None:
    if endpoint.host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return pid_listening_on(endpoint.port)
