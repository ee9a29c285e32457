"""Reply-text cases: 404, 403, 405, 530 and 406 on channels and connections (see
``reply_cases.py``)."""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support.rawamqp import RawAMQP
from tqbroker.protocol.methods import BasicConsume, QueueDeclare

from .reply_harness import (
    CASES,
    Answer,
    Case,
    case,
    channel_case,
    connection,
    declare,
    declare_twice,
    params,
    raw_case,
    refused,
)

# -- 404 ------------------------------------------------------------------------------------------


@case
def case_queue_passive_missing(host: str, port: int) -> Answer:
    return declare("c.missing", passive=True)(host, port)


@case
def case_exchange_passive_missing(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.missing-x", passive=True)

    return channel_case(body)(host, port)


@case
def case_bind_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_bind("c.missing", "amq.direct", "rk")

    return channel_case(body)(host, port)


@case
def case_bind_missing_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.bindx")
        ch.queue_bind("c.bindx", "c.missing-x", "rk")

    return channel_case(body, queues=("c.bindx",))(host, port)


@case
def case_exchange_bind_missing_destination(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_bind("c.missing-x", "amq.direct", "rk")

    return channel_case(body)(host, port)


@case
def case_publish_missing_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_publish("c.missing-x", "rk", b"x")

    return channel_case(body)(host, port)


@case
def case_consume_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_consume("c.missing", lambda *_: None)

    return channel_case(body)(host, port)


@case
def case_get_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_get("c.missing")

    return channel_case(body)(host, port)


@case
def case_purge_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_purge("c.missing")

    return channel_case(body)(host, port)


@case
def case_no_previously_declared_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_bind("", "amq.direct", "rk")

    return channel_case(body)(host, port)


@case
def case_delete_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_delete("c.missing")

    return channel_case(body)(host, port)


@case
def case_delete_missing_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_delete("c.missing-x")

    return channel_case(body)(host, port)


# -- 403 ------------------------------------------------------------------------------------------


@case
def case_declare_default_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("")

    return channel_case(body)(host, port)


@case
def case_delete_default_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_delete("")

    return channel_case(body)(host, port)


@case
def case_bind_default_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.binddef")
        ch.queue_bind("c.binddef", "", "rk")

    return channel_case(body, queues=("c.binddef",))(host, port)


@case
def case_declare_amq_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("amq.c-custom")

    return channel_case(body)(host, port)


@case
def case_delete_amq_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_delete("amq.direct")

    return channel_case(body)(host, port)


@case
def case_declare_amq_queue(host: str, port: int) -> Answer:
    return declare("amq.c-queue")(host, port)


@case
def case_publish_internal_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.internal", internal=True)
        ch.basic_publish("c.internal", "rk", b"x")

    return channel_case(body, exchanges=("c.internal",))(host, port)


@case
def case_exclusive_consumer_taken(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.exclcons")
        ch.basic_consume("c.exclcons", lambda *_: None, exclusive=True)
        other = _conn.channel()
        other.basic_consume("c.exclcons", lambda *_: None)

    return channel_case(body, queues=("c.exclcons",))(host, port)


@case
def case_consume_beside_consumers_exclusively(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.exclcons2")
        ch.basic_consume("c.exclcons2", lambda *_: None)
        other = _conn.channel()
        other.basic_consume("c.exclcons2", lambda *_: None, exclusive=True)

    return channel_case(body, queues=("c.exclcons2",))(host, port)


@case
def case_login_refused(host: str, port: int) -> Answer:
    try:
        pika.BlockingConnection(params(host, port, password="wrong")).close()
    except pika.exceptions.AMQPConnectionError as exc:
        return refused(exc)
    return ["ok"]


# -- 405 ------------------------------------------------------------------------------------------


def _otherconnection(queue: str, first: dict[str, Any], second: dict[str, Any]) -> Case:
    def run(host: str, port: int) -> Answer:
        with connection(host, port) as owner:
            owner.channel().queue_declare(queue, **first)
            return declare(queue, **second)(host, port)

    return run


CASES["exclusive_declared_elsewhere"] = _otherconnection(
    "c.locked", {"exclusive": True}, {"exclusive": True}
)
CASES["exclusive_passive_elsewhere"] = _otherconnection(
    "c.locked2", {"exclusive": True}, {"passive": True}
)
CASES["exclusive_mismatch_same_connection"] = declare_twice({}, {"exclusive": True}, "c.locked3")


@case
def case_exclusive_consume_elsewhere(host: str, port: int) -> Answer:
    with connection(host, port) as owner:
        owner.channel().queue_declare("c.locked4", exclusive=True)

        def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
            ch.basic_consume("c.locked4", lambda *_: None)

        return channel_case(body)(host, port)


# -- 530 ------------------------------------------------------------------------------------------


@case
def case_vhost_not_found(host: str, port: int) -> Answer:
    try:
        pika.BlockingConnection(params(host, port, vhost="c-nope")).close()
    except pika.exceptions.AMQPConnectionError as exc:
        return refused(exc)
    return ["ok"]


def _consume_twice(raw: RawAMQP) -> None:
    raw.open_channel(1)
    raw.send_method(1, QueueDeclare(queue="c.tag", exclusive=True))
    raw.send_method(1, BasicConsume(queue="c.tag", consumer_tag="c-tag"))
    raw.send_method(1, BasicConsume(queue="c.tag", consumer_tag="c-tag"))


CASES["reuse_consumer_tag"] = raw_case(_consume_twice)


def _elsewhere(queue: str, operation: Any) -> Case:
    """``operation(channel)`` on a queue another, still open, connection declared exclusive."""

    def run(host: str, port: int) -> Answer:
        with connection(host, port) as owner:
            owner.channel().queue_declare(queue, exclusive=True)
            return channel_case(lambda _conn, ch: operation(ch))(host, port)

    return run


CASES["exclusive_purge_elsewhere"] = _elsewhere("c.locked5", lambda ch: ch.queue_purge("c.locked5"))
CASES["exclusive_delete_elsewhere"] = _elsewhere(
    "c.locked6", lambda ch: ch.queue_delete("c.locked6")
)
CASES["exclusive_bind_elsewhere"] = _elsewhere(
    "c.locked7", lambda ch: ch.queue_bind("c.locked7", "amq.direct", "rk")
)
CASES["exclusive_get_elsewhere"] = _elsewhere("c.locked8", lambda ch: ch.basic_get("c.locked8"))


# -- exchanges and bindings ------------------------------------------------------------------------


def _on_channel(
    operation: Any, queues: tuple[str, ...] = (), exchanges: tuple[str, ...] = ()
) -> Case:
    return channel_case(lambda _conn, ch: operation(ch), queues, exchanges)


CASES["exchange_bind_missing_source"] = _on_channel(
    lambda ch: ch.exchange_bind("amq.direct", "c.missing-x", "rk")
)
CASES["exchange_unbind_missing"] = _on_channel(
    lambda ch: ch.exchange_unbind("amq.direct", "amq.fanout", "rk")
)
CASES["queue_unbind_missing_binding"] = _on_channel(
    lambda ch: (ch.queue_declare("c.unbind"), ch.queue_unbind("c.unbind", "amq.direct", "rk")),
    queues=("c.unbind",),
)
CASES["queue_unbind_missing_exchange"] = _on_channel(
    lambda ch: (ch.queue_declare("c.unbind2"), ch.queue_unbind("c.unbind2", "c.missing-x", "rk")),
    queues=("c.unbind2",),
)
CASES["redeclare_amq_direct_as_fanout"] = _on_channel(
    lambda ch: ch.exchange_declare("amq.direct", "fanout", durable=True)
)
CASES["redeclare_amq_direct_unchanged"] = _on_channel(
    lambda ch: ch.exchange_declare("amq.direct", "direct", durable=True)
)
CASES["cancel_unknown_consumer"] = _on_channel(lambda ch: ch.basic_cancel("c-nobody"))
