"""Brokers for the admin tools' tests: tqbroker in a thread, and (where Debian's
``rabbitmq-server`` is installed) a loopback RabbitMQ with its management plugin, the oracle the
RabbitMQ-style commands must work against as well. Both are ``Broker``s: an HTTP API URL with
the credentials (what ``--url`` takes) and an AMQP URL (for pika)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx

ROOT = Path(__file__).resolve().parents[2]
RABBITMQ_SERVER = "/usr/sbin/rabbitmq-server"
RABBITMQCTL = "/usr/sbin/rabbitmqctl"


@attrs.frozen
class Broker:
    name: str
    api_url: str  # http://guest:guest@127.0.0.1:PORT
    amqp_url: str

    def ctl(self, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
        """``python -m tqbroker ctl ARGS --url ...``, which must exit with ``status``."""
        done = subprocess.run(
            [sys.executable, "-m", "tqbroker", "ctl", "--url", self.api_url, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == status, (self.name, args, done.stdout, done.stderr)
        return done

    def api(self) -> httpx.Client:
        base = self.api_url.replace("guest:guest@", "")
        return httpx.Client(base_url=base, auth=("guest", "guest"), timeout=30)


@contextlib.contextmanager
def rabbitmq() -> Iterator[Broker]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from targets import Epmd, RabbitMQTarget, _free_port
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    root = Path(tempfile.mkdtemp(prefix="tqbroker-ctl-rabbitmq-"))
    root.chmod(0o777)
    node = root / "node"
    node.mkdir()
    shutil.chown(node, "rabbitmq")
    epmd = Epmd()
    target = RabbitMQTarget(node, RABBITMQ_SERVER, RABBITMQCTL, epmd=epmd)
    management = _free_port()
    (node / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{target.port}\nloopback_users.guest = true\n"
        f"management.tcp.port = {management}\nmanagement.tcp.ip = 127.0.0.1\n"
        "collect_statistics_interval = 500\n"  # the API's counts within half a second
    )
    (node / "enabled_plugins").write_text("[rabbitmq_management].\n")
    for path in node.rglob("*"):
        shutil.chown(path, "rabbitmq")
    try:
        target.start()
        yield Broker(
            "rabbitmq",
            f"http://guest:guest@127.0.0.1:{management}",
            f"amqp://guest:guest@127.0.0.1:{target.port}/",
        )
    finally:
        target.close()
        epmd.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def eventually(check: object, timeout: float = 15) -> None:
    """Until ``check()`` is true: RabbitMQ's management API shows changes after its next
    statistics round."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)
