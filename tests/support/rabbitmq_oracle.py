"""A real RabbitMQ on loopback, with the management and Prometheus plugins, as the oracle that
tests compare tqbroker's answers with (``rabbitmq_oracle``: one node per test session, started
on first use; the tests using it skip when Debian's ``rabbitmq-server`` is not installed).
Started through the benchmark suite's ``RabbitMQTarget`` (its own ports, node name, data, logs
and Erlang cookie under a temporary directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.support.ports import free_port

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SERVER = "/usr/sbin/rabbitmq-server"
CTL = "/usr/sbin/rabbitmqctl"


@attrs.frozen
class RabbitMQ:
    port: int  # AMQP
    management_port: int
    prometheus_port: int

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"


@pytest.fixture(scope="session")
def rabbitmq_oracle() -> Iterator[RabbitMQ]:
    if not (os.path.exists(SERVER) and os.path.exists(CTL)):
        pytest.skip("needs a RabbitMQ to compare with: apt-get install rabbitmq-server")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from targets import Epmd, RabbitMQTarget
    finally:
        sys.path.remove(str(BENCHMARKS))
    root = Path(tempfile.mkdtemp(prefix="tqbroker-oracle-")) / "node"
    epmd = Epmd()
    target = RabbitMQTarget(root, SERVER, CTL, epmd=epmd)
    management, prometheus = free_port(), free_port()
    (root / "enabled_plugins").write_text("[rabbitmq_management,rabbitmq_prometheus].\n")
    with open(root / "rabbitmq.conf", "a") as conf:
        conf.write(
            f"management.tcp.port = {management}\nmanagement.tcp.ip = 127.0.0.1\n"
            f"prometheus.tcp.port = {prometheus}\nprometheus.tcp.ip = 127.0.0.1\n"
        )
    if os.geteuid() == 0:  # Debian's script runs the node as the rabbitmq user
        subprocess.run(["chown", "-R", "rabbitmq", str(root.parent)], check=False)
    try:
        target.start()
    except RuntimeError as exc:
        pytest.skip(f"the oracle RabbitMQ did not start: {exc}")
    try:
        yield RabbitMQ(target.port, management, prometheus)
    finally:
        target.close()
        epmd.cleanup()
        shutil.rmtree(root.parent, ignore_errors=True)
