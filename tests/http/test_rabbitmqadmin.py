"""RabbitMQ's own management client, ``/usr/bin/rabbitmqadmin`` from Debian's rabbitmq-server
package, unmodified against tqbroker: list, declare, delete, purge, publish, get, close and
show; and ``list queues`` prints what it prints against a real RabbitMQ for the same topology."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pika
import pytest

from tests.support.polling import eventually
from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

RABBITMQADMIN = "/usr/bin/rabbitmqadmin"
VHOST = "admin-compare"


def serve_until_closed(connection: pika.BlockingConnection) -> None:
    """Read from the broker (for at most 5 s) until it closes the connection."""
    connection.process_data_events(time_limit=5)
    connection.channel()


pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not Path(RABBITMQADMIN).exists() or shutil.which("python3") is None,
        reason="needs rabbitmqadmin: apt-get install rabbitmq-server",
    ),
]


def admin(port: int, *args: str) -> str:
    done = subprocess.run(
        [
            "python3",
            RABBITMQADMIN,
            "-H",
            "127.0.0.1",
            "-P",
            str(port),
            "-u",
            "guest",
            "-p",
            "guest",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, f"rabbitmqadmin {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def declare_topology(port: int, *vhost: str) -> None:
    """The same topology, through rabbitmqadmin, on either broker (``"-V", name``: in a vhost)."""
    admin(
        port,
        *vhost,
        "declare",
        "queue",
        "name=orders",
        "durable=true",
        'arguments={"x-max-length": 100}',
    )
    admin(port, *vhost, "declare", "queue", "name=audit", "durable=false")
    admin(port, *vhost, "declare", "exchange", "name=events", "type=topic")
    admin(
        port,
        *vhost,
        "declare",
        "binding",
        "source=events",
        "destination=orders",
        "routing_key=order.*",
    )
    admin(port, *vhost, "declare", "binding", "source=events", "destination=audit", "routing_key=#")
    for n in range(3):
        admin(port, *vhost, "publish", "exchange=events", "routing_key=order.new", f"payload=o{n}")


def test_rabbitmqadmin_commands(tqbroker_thread: RunningBroker) -> None:
    port = tqbroker_thread.http_port
    assert port is not None
    declare_topology(port)
    queues = admin(port, "list", "queues")
    assert "| orders | 3        |" in queues
    assert "| audit  | 3        |" in queues
    assert "| events      | topic   |" in admin(port, "list", "exchanges")
    bindings = admin(port, "list", "bindings", "source", "destination", "routing_key")
    assert "| events | orders      | order.*     |" in bindings
    assert "| /    | 6        |" in admin(port, "list", "vhosts")
    got = admin(port, "get", "queue=orders", "count=2", "ackmode=ack_requeue_false")
    assert "o0" in got
    assert "o1" in got
    assert "o2" not in got
    admin(port, "purge", "queue", "name=audit")
    assert "| audit  | 0        |" in admin(port, "list", "queues")
    assert "queue_totals.messages" in admin(port, "show", "overview")
    assert "| guest | administrator |" in admin(port, "list", "users", "name", "tags")
    assert "| /     | guest |" in admin(port, "list", "permissions", "vhost", "user")
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    try:
        channel = connection.channel()
        channel.basic_consume("orders", lambda *_: None, consumer_tag="watcher")
        listed = admin(port, "-f", "tsv", "-q", "list", "connections", "name", "user", "channels")
        name, user, channels = listed.strip().split("\t")
        assert (user, channels) == ("guest", "1")
        assert "watcher" in admin(port, "list", "consumers")
        assert "guest" in admin(port, "list", "channels")
        admin(port, "close", "connection", f"name={name}")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            serve_until_closed(connection)
        assert closed.value.reply_code == 320
    finally:
        if connection.is_open:
            connection.close()
    admin(port, "delete", "queue", "name=audit")
    admin(port, "delete", "exchange", "name=events")
    assert "audit" not in admin(port, "list", "queues")
    assert "events" not in admin(port, "list", "exchanges")


def test_list_queues_prints_what_rabbitmq_prints(rabbitmq_oracle: RabbitMQ) -> None:
    # A vhost of its own on both brokers: other tests share the oracle's "/".
    config = BrokerConfig(port=0, vhosts=("/", VHOST))
    rabbit = rabbitmq_oracle.management_port
    admin(rabbit, "declare", "vhost", f"name={VHOST}")
    with running_broker(config) as broker:
        port = broker.http_port
        assert port is not None
        declare_topology(port, "-V", VHOST)
        declare_topology(rabbit, "-V", VHOST)
        # RabbitMQ's management agent reports queue lengths every 5 seconds: wait for them.
        eventually(lambda: "| 3 " in admin(rabbit, "-V", VHOST, "list", "queues"), 15, 0.5)
        try:
            for args in (
                ("list", "queues"),
                ("list", "queues", "name", "messages", "messages_ready", "consumers", "durable"),
                ("list", "bindings"),
                # tsv: RabbitMQ's longer amq.rabbitmq.trace would widen a table's column
                ("-f", "tsv", "list", "exchanges", "name", "type", "durable", "auto_delete"),
                ("-f", "long", "list", "queues", "name", "arguments", "auto_delete", "exclusive"),
            ):
                ours = admin(port, "-V", VHOST, *args, "--sort", "name")
                theirs = admin(rabbit, "-V", VHOST, *args, "--sort", "name")
                if "exchanges" in args:
                    # RabbitMQ has amq.rabbitmq.trace too (tracing is not implemented here).
                    lines = theirs.splitlines(keepends=True)
                    theirs = "".join(line for line in lines if "amq.rabbitmq.trace" not in line)
                # The same table (rows in the same order where the sort decides it).
                assert sorted(ours.splitlines()) == sorted(theirs.splitlines()), " ".join(args)
                if "bindings" not in args:  # bindings have no name to sort by
                    assert ours == theirs, f"rabbitmqadmin {' '.join(args)}"
        finally:
            admin(rabbit, "delete", "vhost", f"name={VHOST}")
