"""The HTTP auth backend (plugins/auth_http) against RabbitMQ 3.10's own
``rabbitmq_auth_backend_http``: one scenario (a login, a wrong password, declares, publishes,
a get, a binding on a topic exchange) run by pika against a RabbitMQ node using the plugin and
against tqbroker, each asking the same Starlette service; the requests must be the same, field
for field and in order. Slow (a RabbitMQ node of its own starts, ~10 s); skipped without
Debian's rabbitmq-server."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker

from .http_auth_service import KINDS, AuthService, running_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
SERVER, CTL = "/usr/sbin/rabbitmq-server", "/usr/sbin/rabbitmqctl"
ENFORCES = importlib.util.find_spec("tqbroker.server.access") is not None


def tables() -> AuthService:
    resources = {("alice", "/", "*", "queue", p) for p in ("configure", "write", "read")}
    resources |= {("alice", "/", "events", "exchange", p) for p in ("configure", "write", "read")}
    resources.add(("alice", "/", "amq.default", "exchange", "write"))
    return AuthService(
        users={"alice": ("alice-pw", "allow management")},
        vhosts={("alice", "/")},
        resources=resources,
        topics={
            ("alice", "/", "events", "eu.orders", "write"),
            ("alice", "/", "events", "eu.#", "read"),
        },
    )


def scenario(host: str, port: int) -> None:
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.URLParameters(f"amqp://alice:wrong@{host}:{port}/"))
    connection = pika.BlockingConnection(
        pika.URLParameters(f"amqp://alice:alice-pw@{host}:{port}/")
    )
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("jobs")
    channel.basic_publish("", "jobs", b"job")
    channel.basic_get("jobs", auto_ack=True)
    channel.exchange_declare("events", "topic")
    channel.queue_bind("jobs", "events", "eu.#")
    channel.basic_publish("events", "eu.orders", b"order")
    connection.close()


@pytest.fixture(scope="module")
def rabbitmq_asked() -> Iterator[list[tuple[str, str, dict[str, str]]]]:
    """The requests a RabbitMQ node with rabbitmq_auth_backend_http sends for the scenario."""
    if not (os.path.exists(SERVER) and os.path.exists(CTL)):
        pytest.skip("needs RabbitMQ's own HTTP auth backend: apt-get install rabbitmq-server")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from targets import Epmd, RabbitMQTarget
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    service = tables()
    with running_service(service):
        root = Path(tempfile.mkdtemp(prefix="tqbroker-authhttp-")) / "node"
        epmd = Epmd()
        node = RabbitMQTarget(root, SERVER, CTL, epmd=epmd)
        (root / "enabled_plugins").write_text("[rabbitmq_auth_backend_http].\n")
        lines = ["auth_backends.1 = http", "auth_http.http_method = post"]
        lines += [f"auth_http.{kind}_path = {service.path(kind)}" for kind in KINDS]
        with open(root / "rabbitmq.conf", "a") as conf:
            conf.write("\n".join(lines) + "\n")
        if os.geteuid() == 0:  # Debian's script runs the node as the rabbitmq user
            subprocess.run(["chown", "-R", "rabbitmq", str(root.parent)], check=False)
        try:
            node.start()
        except RuntimeError as exc:
            pytest.skip(f"the RabbitMQ node did not start: {exc}")
        try:
            scenario("127.0.0.1", node.port)
            yield list(service.requests)
        finally:
            node.close()
            epmd.cleanup()
            shutil.rmtree(root.parent, ignore_errors=True)


def test_tqbroker_asks_what_rabbitmq_asks(
    rabbitmq_asked: list[tuple[str, str, dict[str, str]]],
) -> None:
    service = tables()
    with running_service(service):
        options = service.options(http_method="post", cache_ttl=0, deny_cache_ttl=0)
        config = BrokerConfig(
            port=0,
            auth_failure_delay=0.01,
            auth_backends=("http",),
            auth_backend_options={"http": options},
        )
        with running_broker(config) as broker:
            scenario(broker.host, broker.port)
    kinds = ("user", "vhost", "resource", "topic") if ENFORCES else ("user", "vhost")
    expected = [r for r in rabbitmq_asked if r[0] in kinds]
    assert [r for r in service.requests if r[0] in kinds] == expected
    assert len(expected) >= (12 if ENFORCES else 3)
