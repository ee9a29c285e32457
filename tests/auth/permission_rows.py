"""RabbitMQ's permission table as rows that run the same way against tqbroker and a real
RabbitMQ (the oracle): each row is one operation by a restricted user, after the resources it
needs were declared by an administrator; its outcome is ``"ok"`` or the ``(code, text)`` of the
channel close.

The users (in vhost ``permtest``): ``permuser`` may configure names with a ``c`` before their
first ``-``, write those with a ``w``, read those with an ``r`` (``cr-q``: configure and read;
``n-x``: nothing), and write the default exchange; ``genuser`` may configure server-named
queues only (``amq.gen-...``) and write or read nothing. ``permuser`` has topic permissions on
the topic exchange ``rw-topic`` (publish with keys starting with its name, bind with keys
starting ``bindable.``) and ``rw-topic2`` (keys starting ``{client_id}.permtest.``: RabbitMQ
expands ``{vhost}`` but has no ``client_id`` for AMQP 0-9-1 and leaves it as written).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs
import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

VHOST = "permtest"
PASSWORD = "s3cret"
# user -> (configure, write, read)
USERS: dict[str, tuple[str, str, str]] = {
    "permuser": (
        "^[^-]*c[^-]*-",
        "^[^-]*w[^-]*-|^amq\\.default$",
        "^[^-]*r[^-]*-",
    ),
    "genuser": ("^amq\\.gen-", "", ""),
}
# (user, exchange, write, read)
TOPIC_PERMISSIONS = [
    ("permuser", "rw-topic", "^{username}\\.", "^bindable\\."),
    # {vhost} is expanded; {client_id} is not (no client_id in AMQP 0-9-1: stays as written)
    ("permuser", "rw-topic2", "^{client_id}\\.{vhost}\\.", ".*"),
]

# Resources the administrator declares before every row: (kind, name, type or arguments).
EXCHANGES = ["n-x0", "r-x0", "w-x", "w-x2", "cw-xd", "rw-topic", "rw-topic2"]
QUEUES = ["n-q0", "r-q0", "w-q0", "c-qdel", "cr-qdel"]

Outcome = str | tuple[int, str]
Operation = Callable[[BlockingChannel], Any]


@attrs.frozen
class Row:
    """One operation by ``user`` (``name`` says what and whether it should be allowed)."""

    name: str
    user: str
    operation: Operation


def _publish(exchange: str, key: str = "k", *, confirm: bool = False) -> Operation:
    def run(ch: BlockingChannel) -> None:
        if confirm:
            ch.confirm_delivery()
        ch.basic_publish(exchange, key, b"m")
        ch.basic_qos(prefetch_count=0)  # a round trip: a refusal closes the channel first

    return run


def _consume(queue: str) -> Operation:
    def run(ch: BlockingChannel) -> None:
        tag = ch.basic_consume(queue, lambda *_: None, auto_ack=queue.startswith("amq."))
        ch.basic_cancel(tag)

    return run


P, G = "permuser", "genuser"
DLX = {"x-dead-letter-exchange": "w-x"}
ROWS: list[Row] = [
    # exchange.declare: configure on the exchange; passive: nothing.
    Row("exchange.declare allowed", P, lambda ch: ch.exchange_declare("c-x", "direct")),
    Row("exchange.declare refused", P, lambda ch: ch.exchange_declare("n-x", "direct")),
    Row("exchange.declare existing refused", P, lambda ch: ch.exchange_declare("n-x0", "direct")),
    Row(
        "exchange.declare passive allowed", P, lambda ch: ch.exchange_declare("n-x0", passive=True)
    ),
    Row(
        "exchange.declare passive missing", P, lambda ch: ch.exchange_declare("n-xm", passive=True)
    ),
    Row("exchange.declare amq.* refused", P, lambda ch: ch.exchange_declare("amq.nx", "direct")),
    Row("exchange.declare amq.* configurable", P, lambda ch: ch.exchange_declare("amq.c-x")),
    # alternate-exchange: read on the exchange, write on the alternate.
    Row(
        "exchange.declare AE allowed",
        P,
        lambda ch: ch.exchange_declare("cr-xa", arguments={"alternate-exchange": "w-x"}),
    ),
    Row(
        "exchange.declare AE write refused",
        P,
        lambda ch: ch.exchange_declare("cr-xa2", arguments={"alternate-exchange": "n-x0"}),
    ),
    Row(
        "exchange.declare AE read refused",
        P,
        lambda ch: ch.exchange_declare("c-xa3", arguments={"alternate-exchange": "w-x"}),
    ),
    # exchange.delete: configure.
    Row("exchange.delete allowed", P, lambda ch: ch.exchange_delete("cw-xd")),
    Row("exchange.delete refused", P, lambda ch: ch.exchange_delete("n-x0")),
    Row("exchange.delete amq.* refused", P, lambda ch: ch.exchange_delete("amq.direct")),
    # queue.declare: configure on the queue; passive: nothing.
    Row("queue.declare allowed", P, lambda ch: ch.queue_declare("c-q")),
    Row("queue.declare refused", P, lambda ch: ch.queue_declare("n-q")),
    Row("queue.declare existing refused", P, lambda ch: ch.queue_declare("n-q0")),
    Row("queue.declare exclusive allowed", P, lambda ch: ch.queue_declare("c-qe", exclusive=True)),
    Row("queue.declare exclusive refused", P, lambda ch: ch.queue_declare("n-qe", exclusive=True)),
    Row("queue.declare passive allowed", P, lambda ch: ch.queue_declare("n-q0", passive=True)),
    Row("queue.declare passive missing", P, lambda ch: ch.queue_declare("n-qm", passive=True)),
    Row("queue.declare amq.* refused", P, lambda ch: ch.queue_declare("amq.nq")),
    Row("queue.declare server-named allowed", G, lambda ch: ch.queue_declare("", exclusive=True)),
    Row("queue.declare server-named refused", P, lambda ch: ch.queue_declare("", exclusive=True)),
    Row("queue.declare reply-to", G, lambda ch: ch.queue_declare("amq.rabbitmq.reply-to")),
    # x-dead-letter-exchange: read on the queue, write on the dead-letter exchange.
    Row("queue.declare DLX allowed", P, lambda ch: ch.queue_declare("cr-qd", arguments=DLX)),
    Row(
        "queue.declare DLX write refused",
        P,
        lambda ch: ch.queue_declare("cr-qd2", arguments={"x-dead-letter-exchange": "n-x0"}),
    ),
    Row("queue.declare DLX read refused", P, lambda ch: ch.queue_declare("c-qd3", arguments=DLX)),
    # queue.delete: configure; queue.purge: read.
    Row("queue.delete allowed", P, lambda ch: ch.queue_delete("c-qdel")),
    Row("queue.delete refused", P, lambda ch: ch.queue_delete("n-q0")),
    Row("queue.purge allowed", P, lambda ch: ch.queue_purge("r-q0")),
    Row("queue.purge refused", P, lambda ch: ch.queue_purge("n-q0")),
    # queue.bind/unbind: write on the queue, read on the exchange.
    Row("queue.bind allowed", P, lambda ch: ch.queue_bind("w-q0", "r-x0", "k")),
    Row("queue.bind write refused", P, lambda ch: ch.queue_bind("n-q0", "r-x0", "k")),
    Row("queue.bind read refused", P, lambda ch: ch.queue_bind("w-q0", "n-x0", "k")),
    Row("queue.bind default exchange", P, lambda ch: ch.queue_bind("w-q0", "", "k")),
    Row("queue.unbind allowed", P, lambda ch: ch.queue_unbind("w-q0", "r-x0", "k")),
    Row("queue.unbind write refused", P, lambda ch: ch.queue_unbind("n-q0", "r-x0", "k")),
    Row("queue.unbind read refused", P, lambda ch: ch.queue_unbind("w-q0", "n-x0", "k")),
    # exchange.bind/unbind: write on the destination, read on the source.
    Row("exchange.bind allowed", P, lambda ch: ch.exchange_bind("w-x", "r-x0", "k")),
    Row("exchange.bind write refused", P, lambda ch: ch.exchange_bind("n-x0", "r-x0", "k")),
    Row("exchange.bind read refused", P, lambda ch: ch.exchange_bind("w-x", "n-x0", "k")),
    Row("exchange.unbind allowed", P, lambda ch: ch.exchange_unbind("w-x", "r-x0", "k")),
    Row("exchange.unbind write refused", P, lambda ch: ch.exchange_unbind("n-x0", "r-x0", "k")),
    Row("exchange.unbind read refused", P, lambda ch: ch.exchange_unbind("w-x", "n-x0", "k")),
    # basic.publish: write on the exchange (the default one is amq.default).
    Row("basic.publish allowed", P, _publish("w-x")),
    Row("basic.publish refused", P, _publish("n-x0")),
    Row("basic.publish default allowed", P, _publish("", "w-q0")),
    Row("basic.publish default refused", G, _publish("", "w-q0")),
    Row("basic.publish confirm refused", P, _publish("n-x0", confirm=True)),
    Row("basic.publish missing allowed", P, _publish("w-missing")),
    Row("basic.publish missing refused", P, _publish("n-missing")),
    # basic.get, basic.consume: read on the queue.
    Row("basic.get allowed", P, lambda ch: ch.basic_get("r-q0")),
    Row("basic.get refused", P, lambda ch: ch.basic_get("n-q0")),
    Row("basic.consume allowed", P, _consume("r-q0")),
    Row("basic.consume refused", P, _consume("n-q0")),
    Row("basic.consume missing refused", P, _consume("n-qm")),
    Row("basic.consume reply-to", G, _consume("amq.rabbitmq.reply-to")),
    # Topic permissions (rw-topic): publish checks write, bind checks read on the key.
    Row("topic publish allowed", P, _publish("rw-topic", "permuser.a")),
    Row("topic publish refused", P, _publish("rw-topic", "other.a")),
    Row("topic bind allowed", P, lambda ch: ch.queue_bind("w-q0", "rw-topic", "bindable.a")),
    Row("topic bind refused", P, lambda ch: ch.queue_bind("w-q0", "rw-topic", "other.a")),
    Row("topic exchange.bind refused", P, lambda ch: ch.exchange_bind("w-x", "rw-topic", "o")),
    Row("topic variables allowed", P, _publish("rw-topic2", "{client_id}.permtest.a")),
    Row("topic variables refused", P, _publish("rw-topic2", "abc.permtest.a")),
]

_SERVER_NAMED = re.compile(r"amq\.gen-[A-Za-z0-9_-]+")


def setup(admin: BlockingChannel) -> None:
    """Declare (again) what the rows need, and drop what some rows create."""
    for name in ["c-x", "n-x", "cr-xa", "cr-xa2", "c-xa3"]:
        admin.exchange_delete(name)
    for name in ["c-q", "n-q", "cr-qd", "cr-qd2", "c-qd3"]:
        admin.queue_delete(name)
    for name in EXCHANGES:
        admin.exchange_declare(name, "topic" if "topic" in name else "direct")
    for name in QUEUES:
        admin.queue_declare(name)


def run(
    admin: BlockingChannel, connections: dict[str, pika.BlockingConnection], row: Row
) -> Outcome:
    """The outcome of one row: ``"ok"`` or the channel (or connection) close's code and text
    (a server-generated queue name in it replaced by ``amq.gen-*``)."""
    setup(admin)
    channel = connections[row.user].channel()
    try:
        row.operation(channel)
    except pika.exceptions.ChannelClosedByBroker as closed:
        return closed.reply_code, _SERVER_NAMED.sub("amq.gen-*", closed.reply_text)
    if channel.is_open:
        channel.close()
    return "ok"


def connect(port: int, user: str, password: str, vhost: str = VHOST) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), heartbeat=0
        )
    )


def run_all(port: int, admin_user: str, admin_password: str) -> dict[str, Outcome]:
    """Every row's outcome against the broker on ``port`` (users already set up there)."""
    admin_connection = connect(port, admin_user, admin_password)
    connections = {user: connect(port, user, PASSWORD) for user in USERS}
    try:
        admin = admin_connection.channel()
        return {row.name: run(admin, connections, row) for row in ROWS}
    finally:
        for connection in [admin_connection, *connections.values()]:
            if connection.is_open:
                connection.close()


def setup_rabbitmq(http_url: str) -> None:
    """The vhost, users and permissions of the rows on a RabbitMQ (its management API, as guest)."""
    import httpx

    with httpx.Client(base_url=http_url, auth=("guest", "guest"), timeout=30) as api:
        api.put(f"/api/vhosts/{VHOST}").raise_for_status()
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        api.put(f"/api/permissions/{VHOST}/guest", json=everything).raise_for_status()
        for user, (configure, write, read) in USERS.items():
            api.put(
                f"/api/users/{user}", json={"password": PASSWORD, "tags": ""}
            ).raise_for_status()
            patterns = {"configure": configure, "write": write, "read": read}
            api.put(f"/api/permissions/{VHOST}/{user}", json=patterns).raise_for_status()
        for user, exchange, write, read in TOPIC_PERMISSIONS:
            body = {"exchange": exchange, "write": write, "read": read}
            api.put(f"/api/topic-permissions/{VHOST}/{user}", json=body).raise_for_status()
