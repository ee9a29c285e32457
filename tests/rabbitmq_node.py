"""A private RabbitMQ node on loopback with the management plugin, for tests that use the real
RabbitMQ as the oracle (Debian's ``rabbitmq-server`` package; tests skip without it).

Its own AMQP, management and distribution ports, node name, data and log directories under
``root``, ``HOME`` there too (its own Erlang cookie); ``guest``/``guest`` from loopback. Run as
root, the Debian scripts switch to the ``rabbitmq`` user: ``root`` is handed to it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
ADMIN = "/usr/bin/rabbitmqadmin"


def missing() -> str | None:
    """Why a node cannot be started here (None: it can)."""
    for program in (SERVER, CTL):
        if not Path(program).exists():
            return f"{program} is absent (Debian package rabbitmq-server)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RabbitMQNode:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port, self.http_port = free_port(), free_port()
        self.node = f"tqtest-{os.getpid()}-{root.name}@localhost"
        root.mkdir(parents=True, exist_ok=True)
        (root / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"management.tcp.port = {self.http_port}\nmanagement.tcp.ip = 127.0.0.1\n"
        )
        (root / "enabled_plugins").write_text("[rabbitmq_management].\n")
        (root / "rabbitmq-env.conf").write_text("")
        self.env = dict(
            os.environ,
            HOME=str(root),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(free_port()),
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
        if os.geteuid() == 0 and shutil.which("chown"):
            subprocess.run(["chown", "-R", "rabbitmq", str(root)], check=False)
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CTL, "-n", self.node, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, timeout: float = 90) -> RabbitMQNode:
        with open(self.root / "server.out", "ab") as out:
            self.popen = subprocess.Popen(
                [SERVER],
                env=self.env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self.popen.returncode}")
            try:
                if self.ctl("await_startup", timeout=30).returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"RabbitMQ did not start within {timeout:g} s")
            time.sleep(0.3)
        self._wait_for_http(deadline)
        return self

    def _wait_for_http(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.http_port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError("RabbitMQ's management listener did not open")

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            # A throwaway node: killed (its session: the script, the VM and its helpers) rather
            # than stopped, which takes ~8 s.
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        self.popen = None
