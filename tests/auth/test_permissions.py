"""RabbitMQ's permission table (``permission_rows.py``): every row's outcome on tqbroker is the
expected one, and the same (code and text) as a real RabbitMQ 3.10's when one is installed.
Also: permissions changed at runtime apply to the next check of an open channel."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.auth import Permission, TopicPermission
from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.testing import RunningBroker, running_broker

from . import permission_rows as rows

EVERYTHING = PermissionConfig()


def _refused(kind: str, name: str, user: str = "permuser") -> tuple[int, str]:
    return (
        403,
        f"ACCESS_REFUSED - access to {kind} '{name}' in vhost 'permtest' refused for user '{user}'",
    )


def _topic(key: str, exchange: str = "rw-topic") -> tuple[int, str]:
    return (
        403,
        f"ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' in vhost 'permtest' "
        "refused for user 'permuser'",
    )


# What RabbitMQ 3.10.8 answers (recorded from the oracle; the oracle test compares live).
EXPECTED: dict[str, rows.Outcome] = {
    "exchange.declare refused": _refused("exchange", "n-x"),
    "exchange.declare existing refused": _refused("exchange", "n-x0"),
    "exchange.declare passive missing": (404, "NOT_FOUND - no exchange 'n-xm' in vhost 'permtest'"),
    "exchange.declare amq.* refused": _refused("exchange", "amq.nx"),
    "exchange.declare amq.* configurable": (
        403,
        "ACCESS_REFUSED - exchange name 'amq.c-x' contains reserved prefix 'amq.*'",
    ),
    "exchange.declare AE write refused": _refused("exchange", "n-x0"),
    "exchange.declare AE read refused": _refused("exchange", "c-xa3"),
    "exchange.delete refused": _refused("exchange", "n-x0"),
    "exchange.delete amq.* refused": (
        403,
        "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost 'permtest' not allowed",
    ),
    "queue.declare refused": _refused("queue", "n-q"),
    "queue.declare existing refused": _refused("queue", "n-q0"),
    "queue.declare exclusive refused": _refused("queue", "n-qe"),
    "queue.declare passive missing": (404, "NOT_FOUND - no queue 'n-qm' in vhost 'permtest'"),
    "queue.declare amq.* refused": (
        403,
        "ACCESS_REFUSED - queue name 'amq.nq' contains reserved prefix 'amq.*'",
    ),
    "queue.declare server-named refused": _refused("queue", "amq.gen-*"),
    "queue.declare DLX write refused": _refused("exchange", "n-x0"),
    "queue.declare DLX read refused": _refused("queue", "c-qd3"),
    "queue.delete refused": _refused("queue", "n-q0"),
    "queue.purge refused": _refused("queue", "n-q0"),
    "queue.bind write refused": _refused("queue", "n-q0"),
    "queue.bind read refused": _refused("exchange", "n-x0"),
    "queue.bind default exchange": (
        403,
        "ACCESS_REFUSED - operation not permitted on the default exchange",
    ),
    "queue.unbind write refused": _refused("queue", "n-q0"),
    "queue.unbind read refused": _refused("exchange", "n-x0"),
    "exchange.bind write refused": _refused("exchange", "n-x0"),
    "exchange.bind read refused": _refused("exchange", "n-x0"),
    "exchange.unbind write refused": _refused("exchange", "n-x0"),
    "exchange.unbind read refused": _refused("exchange", "n-x0"),
    "basic.publish refused": _refused("exchange", "n-x0"),
    "basic.publish default refused": _refused("exchange", "amq.default", "genuser"),
    "basic.publish confirm refused": _refused("exchange", "n-x0"),
    "basic.publish missing allowed": (
        404,
        "NOT_FOUND - no exchange 'w-missing' in vhost 'permtest'",
    ),
    "basic.publish missing refused": _refused("exchange", "n-missing"),
    "basic.get refused": _refused("queue", "n-q0"),
    "basic.consume refused": _refused("queue", "n-q0"),
    "basic.consume missing refused": _refused("queue", "n-qm"),
    "topic publish refused": _topic("other.a"),
    "topic bind refused": _topic("other.a"),
    "topic exchange.bind refused": _topic("o"),
    "topic variables refused": _topic("abc.permtest.a", "rw-topic2"),
}


def _config() -> BrokerConfig:
    users = [
        UserConfig(
            "guest",
            "guest",
            tags=("administrator",),
            permissions={"/": EVERYTHING, rows.VHOST: EVERYTHING},
        )
    ]
    for name, (configure, write, read) in rows.USERS.items():
        permission = PermissionConfig(configure, write, read)
        users.append(UserConfig(name, rows.PASSWORD, permissions={rows.VHOST: permission}))
    return BrokerConfig(port=0, vhosts=("/", rows.VHOST), users=tuple(users))


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker(_config()) as running:
        assert running.broker is not None
        for user, exchange, write, read in rows.TOPIC_PERMISSIONS:
            running.broker.users.set_topic_permissions(
                user, rows.VHOST, TopicPermission(exchange, write, read)
            )
        yield running


def test_every_row_as_rabbitmq_answers(broker: RunningBroker) -> None:
    got = rows.run_all(broker.port, "guest", "guest")
    expected = {row.name: EXPECTED.get(row.name, "ok") for row in rows.ROWS}
    assert got == expected


def test_every_row_against_rabbitmq(rabbitmq_oracle: RabbitMQ, broker: RunningBroker) -> None:
    """The same rows on the oracle RabbitMQ and on tqbroker: the same outcomes."""
    rows.setup_rabbitmq(rabbitmq_oracle.http_url)
    oracle = rows.run_all(rabbitmq_oracle.port, "guest", "guest")
    assert rows.run_all(broker.port, "guest", "guest") == oracle


def test_permissions_changed_at_runtime_apply_to_the_next_check(broker: RunningBroker) -> None:
    """An open channel that published to an exchange (its answer cached) is refused once the
    user's permissions change, and allowed again once they are restored."""
    assert broker.broker is not None
    users = broker.broker.users
    saved = users.permission("permuser", rows.VHOST)
    assert saved is not None
    connection = rows.connect(broker.port, "permuser", rows.PASSWORD)
    try:
        channel = connection.channel()
        channel.exchange_declare("cw-rt", "direct")
        channel.basic_publish("cw-rt", "k", b"m")
        channel.basic_qos(prefetch_count=0)
        users.set_permissions("permuser", rows.VHOST, Permission(saved.configure, "^nothing$", ""))
        channel.basic_publish("cw-rt", "k", b"m")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_qos(prefetch_count=0)
        assert (closed.value.reply_code, closed.value.reply_text) == _refused("exchange", "cw-rt")
        users.set_permissions("permuser", rows.VHOST, saved)
        channel = connection.channel()
        channel.basic_publish("cw-rt", "k", b"m")
        channel.basic_qos(prefetch_count=0)
        channel.exchange_delete("cw-rt")
    finally:
        users.set_permissions("permuser", rows.VHOST, saved)
        connection.close()
