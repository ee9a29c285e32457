"""RabbitMQ's own management client, ``/usr/bin/rabbitmqadmin``, declares and deletes users,
permissions, vhosts and vhost limits on tqbroker; its listings print what they print against the
oracle RabbitMQ for the same commands."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pika
import pytest

from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.testing import RunningBroker, running_broker

RABBITMQADMIN = "/usr/bin/rabbitmqadmin"
CREDENTIALS = ("-u", "guest", "-p", "guest")

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not Path(RABBITMQADMIN).exists() or shutil.which("python3") is None,
        reason="needs rabbitmqadmin: apt-get install rabbitmq-server",
    ),
]


def admin(port: int, *args: str, status: int = 0) -> str:
    done = subprocess.run(
        ["python3", RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), *CREDENTIALS, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == status, f"rabbitmqadmin {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def script(port: int, user: str, vhost: str) -> list[str]:
    """The same declarations on either broker; what the listings print."""
    printed = [
        admin(port, "declare", "vhost", f"name={vhost}"),
        admin(port, "declare", "user", f"name={user}", "password=s3cret", "tags=monitoring"),
        admin(
            port,
            "declare",
            "permission",
            f"vhost={vhost}",
            f"user={user}",
            "configure=^x",
            "write=.*",
            "read=",
        ),
        admin(port, "declare", "vhost_limit", f"vhost={vhost}", "name=max-queues", "value=7"),
    ]
    listings = [
        admin(port, "-f", "tsv", "-q", "list", "users", "name", "tags"),
        admin(port, "-f", "tsv", "-q", "list", "permissions", "vhost", "user", "configure", "read"),
        admin(port, "-f", "tsv", "-q", "list", "vhost_limits", "vhost", "value"),
    ]
    # Other tests' users and vhosts may be there too: only this run's lines.
    printed += [
        "\n".join(line for line in text.splitlines() if user in line or vhost in line)
        for text in listings
    ]
    printed += [
        admin(
            port,
            "declare",
            "permission",
            f"vhost=no-{vhost}",
            f"user={user}",
            "configure=.*",
            "write=.*",
            "read=.*",
            status=1,
        ),
        admin(port, "delete", "permission", f"vhost={vhost}", f"user={user}"),
        admin(port, "delete", "vhost_limit", f"vhost={vhost}", "name=max-queues"),
        admin(port, "delete", "user", f"name={user}"),
        admin(port, "delete", "vhost", f"name={vhost}"),
        admin(port, "delete", "user", f"name={user}", status=1),
    ]
    return [text.replace(user, "U").replace(vhost, "V") for text in printed]


def _serve_until_closed(connection: pika.BlockingConnection) -> None:
    connection.process_data_events(time_limit=5)
    connection.channel()


def test_rabbitmqadmin_manages_users(tqbroker_thread: RunningBroker) -> None:
    port = tqbroker_thread.http_port
    assert port is not None
    admin(port, "declare", "vhost", "name=adm")
    admin(port, "declare", "user", "name=adm", "password=s3cret", "tags=")
    admin(
        port,
        "declare",
        "permission",
        "vhost=adm",
        "user=adm",
        "configure=.*",
        "write=.*",
        "read=.*",
    )
    credentials = pika.PlainCredentials("adm", "s3cret")
    parameters = pika.ConnectionParameters(
        tqbroker_thread.host, tqbroker_thread.port, "adm", credentials
    )
    connection = pika.BlockingConnection(parameters)
    connection.channel().queue_declare("adm-q")
    admin(port, "delete", "user", "name=adm")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        _serve_until_closed(connection)
    assert closed.value.reply_text == "CONNECTION_FORCED - user 'adm' is deleted"
    admin(port, "delete", "vhost", "name=adm")
    assert "adm" not in admin(port, "list", "vhosts")


def test_rabbitmqadmin_prints_what_rabbitmq_prints(rabbitmq_oracle: RabbitMQ) -> None:
    user, vhost = f"adm-{uuid.uuid4().hex[:6]}", f"admv-{uuid.uuid4().hex[:6]}"
    with running_broker() as broker:
        assert broker.http_port is not None
        ours = script(broker.http_port, user, vhost)
    theirs = script(rabbitmq_oracle.management_port, user, vhost)
    assert ours == theirs
