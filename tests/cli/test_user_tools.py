"""``tqbroker-ctl``'s rabbitmqctl-style user, permission, vhost and limit commands, run as real
processes against tqbroker and against the oracle RabbitMQ (the same API calls, so the same
results): a user added with its password on standard input logs in over AMQP, keeps its
password through ``set-user-tags`` and its tags through ``change-password``; no password is
ever printed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pika
import pika.exceptions
import pytest

from .brokers import Broker

pytestmark = pytest.mark.timeout(180)
UNREACHABLE = "http://admin:Hunter2@127.0.0.1:1"


def _login(broker: Broker, user: str, password: str, vhost: str = "/") -> None:
    base = pika.URLParameters(broker.amqp_url)
    credentials = pika.PlainCredentials(user, password)
    parameters = pika.ConnectionParameters(base.host, base.port, vhost, credentials)
    pika.BlockingConnection(parameters).close()


def _tags(broker: Broker, user: str) -> list[str]:
    """``user``'s tags as ``list-users`` prints them (sorted: RabbitMQ keeps the given order,
    tqbroker sorts them)."""
    users = json.loads(broker.ctl("list-users", "--format", "json").stdout)
    return sorted(next(u["tags"] for u in users if u["user"] == user))


def _ctl_stdin(broker: Broker, stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tqbroker", "ctl", "--url", broker.api_url, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_user_commands(broker: Broker) -> None:
    user = f"ctl-{uuid.uuid4().hex[:6]}"
    added = _ctl_stdin(broker, "first-Secret\n", "add-user", user)
    assert "first-Secret" not in added.stdout + added.stderr
    refused = broker.ctl("add-user", user, "x", status=1)
    assert f"user '{user}' already exists" in refused.stderr
    broker.ctl("set_permissions", user, ".*", ".*", ".*")  # rabbitmqctl's spelling works too
    _login(broker, user, "first-Secret")
    broker.ctl("set-user-tags", user, "monitoring", "custom")
    _login(broker, user, "first-Secret")  # the password was kept
    assert _tags(broker, user) == ["custom", "monitoring"]
    changed = broker.ctl("change-password", user, "second-Secret")
    assert "second-Secret" not in changed.stdout + changed.stderr
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        _login(broker, user, "first-Secret")
    _login(broker, user, "second-Secret")
    assert _tags(broker, user) == ["custom", "monitoring"]  # tags kept
    listed = json.loads(broker.ctl("list-permissions", "--format", "json").stdout)
    assert {"user": user, "configure": ".*", "write": ".*", "read": ".*"} in listed
    broker.ctl("set-topic-permissions", user, "amq.topic", "^a", ".*")
    topic = json.loads(broker.ctl("list-topic-permissions", "--format", "json").stdout)
    assert {"user": user, "exchange": "amq.topic", "write": "^a", "read": ".*"} in topic
    broker.ctl("clear-topic-permissions", user)
    broker.ctl("clear-permissions", user)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        _login(broker, user, "second-Secret")
    broker.ctl("delete-user", user)
    missing = broker.ctl("delete-user", user, status=1)
    assert f"no user '{user}'" in missing.stderr
    assert user not in broker.ctl("list-users").stdout


def test_vhost_and_limit_commands(broker: Broker) -> None:
    vhost, user = f"ctlv-{uuid.uuid4().hex[:6]}", f"ctlu-{uuid.uuid4().hex[:6]}"
    broker.ctl("add-vhost", vhost, "--description", "for ctl")
    vhosts = json.loads(broker.ctl("list", "vhosts", "--format", "json").stdout)
    assert {"name": vhost} in vhosts
    broker.ctl("-p", vhost, "set-vhost-limits", '{"max-connections": 0, "max-queues": 3}')
    limits = json.loads(broker.ctl("-p", vhost, "list-vhost-limits", "--format", "json").stdout)
    assert limits == [{"vhost": vhost, "limits": {"max-connections": 0, "max-queues": 3}}]
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        _login(broker, "guest", "guest", vhost)
    assert "connection limit (0) is reached" in str(refused.value)
    broker.ctl("-p", vhost, "set-vhost-limits", '{"max-queues": 3}')  # replaces: no max-conn
    _login(broker, "guest", "guest", vhost)
    bad = broker.ctl("-p", vhost, "set-vhost-limits", '{"max-foo": 1}', status=1)
    assert "Unrecognised terms" in bad.stderr
    broker.ctl("-p", vhost, "clear-vhost-limits")
    assert json.loads(broker.ctl("-p", vhost, "list-vhost-limits", "--format", "json").stdout) == []
    broker.ctl("add-user", user, "pw")
    broker.ctl("set-user-limits", user, '{"max-channels": 4}')
    listed = json.loads(broker.ctl("list-user-limits", user, "--format", "json").stdout)
    assert listed == [{"user": user, "limits": {"max-channels": 4}}]
    broker.ctl("clear-user-limits", user, "all")
    assert json.loads(broker.ctl("list-user-limits", user, "--format", "json").stdout) == []
    broker.ctl("delete-user", user)
    broker.ctl("delete-vhost", vhost)
    assert f"no vhost '{vhost}'" in broker.ctl("delete-vhost", vhost, status=1).stderr


def test_no_password_in_errors() -> None:
    """An unreachable broker's URL is shown without its credentials."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tqbroker",
            "ctl",
            "--url",
            UNREACHABLE,
            "add-user",
            "x",
            "Swordfish",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "cannot reach http://127.0.0.1:1" in done.stderr
    for secret in ("Hunter2", "Swordfish"):
        assert secret not in done.stdout + done.stderr
