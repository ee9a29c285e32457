"""The error paths RabbitMQ users hit, as client-side scenarios runnable against any broker.

Each case opens its own connection(s) to ``host:port`` (pika for what a client library can
send, ``rawamqp`` for frames no library sends), provokes one error and returns what the broker
answered: ``[reply code, reply text]`` of the channel or connection close, or ``"ok"`` when the
broker did not refuse. ``capture(host, port)`` runs every case; ``rabbitmq_replies.json`` holds
the answers captured from RabbitMQ 3.10, the texts tqbroker must give word for word.

Queue and exchange names are fixed per case (``c.<case>``) so the texts are comparable; a case
deletes what it declared so that the cases can run in any order against one broker.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from rawamqp import RawAMQP, SocketClosed, body_frame, frame, method_arguments, method_frame

from tqbroker.protocol.frames import FRAME_METHOD
from tqbroker.protocol.methods import (
    BasicConsume,
    BasicPublish,
    ChannelClose,
    ChannelOpen,
    ConnectionClose,
    QueueDeclare,
)

TABLE = Path(__file__).with_name("rabbitmq_replies.json")

Answer = list[Any]  # [code, text] or ["ok"]
Case = Callable[[str, int], Answer]
CASES: dict[str, Case] = {}


def case(function: Case) -> Case:
    CASES[function.__name__.removeprefix("case_")] = function
    return function


def _params(host: str, port: int, vhost: str = "/", password: str = "guest") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host,
        port,
        vhost,
        pika.PlainCredentials("guest", password),
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=10,
    )


@contextlib.contextmanager
def _connection(host: str, port: int) -> Iterator[BlockingConnection]:
    conn = pika.BlockingConnection(_params(host, port))
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _cleanup(
    host: str, port: int, queues: tuple[str, ...] = (), exchanges: tuple[str, ...] = ()
) -> None:
    """Delete what a case declared (each on its own channel: an exclusive queue of another,
    still open, connection refuses)."""
    with _connection(host, port) as conn:
        for queue in queues:
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                conn.channel().queue_delete(queue)
        for exchange in exchanges:
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                conn.channel().exchange_delete(exchange)


def _refused(exc: BaseException) -> Answer:
    """The broker's connection.close inside pika's connection-attempt errors."""
    if isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
        return [exc.reply_code, exc.reply_text]
    match = re.search(r"\((\d+)\) '(.*)'$", str(exc))  # pika keeps only the words
    if match is not None:
        return [int(match.group(1)), match.group(2)]
    return ["error", type(exc).__name__]


def _channel_case(
    body: Callable[[BlockingConnection, BlockingChannel], None],
    queues: tuple[str, ...] = (),
    exchanges: tuple[str, ...] = (),
) -> Case:
    """A case that runs ``body`` on a fresh channel and reports how the broker closed it."""

    def run(host: str, port: int) -> Answer:
        try:
            with _connection(host, port) as conn:
                ch = conn.channel()
                try:
                    body(conn, ch)
                    # an asynchronous refusal (basic.publish, basic.ack) arrives after a round trip
                    ch.queue_declare("", exclusive=True)
                    conn.process_data_events(0.2)
                    ch.queue_declare("", exclusive=True)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    return [exc.reply_code, exc.reply_text]
                except pika.exceptions.ConnectionClosedByBroker as exc:
                    return [exc.reply_code, exc.reply_text]
            return ["ok"]
        finally:
            _cleanup(host, port, queues, exchanges)

    return run


def _declare_twice(first: dict[str, Any], second: dict[str, Any], queue: str) -> Case:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare(queue, **first)
        ch.queue_declare(queue, **second)

    return _channel_case(body, queues=(queue,))


def _declare(queue: str, **kwargs: Any) -> Case:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare(queue, **kwargs)

    return _channel_case(body, queues=(queue,))


def _args(queue: str, arguments: dict[str, Any], durable: bool = False, **kwargs: Any) -> Case:
    return _declare(queue, durable=durable, arguments=arguments, **kwargs)


# -- 404 ------------------------------------------------------------------------------------------


@case
def case_queue_passive_missing(host: str, port: int) -> Answer:
    return _declare("c.missing", passive=True)(host, port)


@case
def case_exchange_passive_missing(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.missing-x", passive=True)

    return _channel_case(body)(host, port)


@case
def case_bind_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_bind("c.missing", "amq.direct", "rk")

    return _channel_case(body)(host, port)


@case
def case_bind_missing_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.bindx")
        ch.queue_bind("c.bindx", "c.missing-x", "rk")

    return _channel_case(body, queues=("c.bindx",))(host, port)


@case
def case_exchange_bind_missing_destination(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_bind("c.missing-x", "amq.direct", "rk")

    return _channel_case(body)(host, port)


@case
def case_publish_missing_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_publish("c.missing-x", "rk", b"x")

    return _channel_case(body)(host, port)


@case
def case_consume_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_consume("c.missing", lambda *_: None)

    return _channel_case(body)(host, port)


@case
def case_get_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_get("c.missing")

    return _channel_case(body)(host, port)


@case
def case_purge_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_purge("c.missing")

    return _channel_case(body)(host, port)


@case
def case_no_previously_declared_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_bind("", "amq.direct", "rk")

    return _channel_case(body)(host, port)


@case
def case_delete_missing_queue(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_delete("c.missing")

    return _channel_case(body)(host, port)


@case
def case_delete_missing_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_delete("c.missing-x")

    return _channel_case(body)(host, port)


# -- 406 inequivalent -----------------------------------------------------------------------------

CASES["inequivalent_durable"] = _declare_twice({}, {"durable": True}, "c.ineq1")
CASES["inequivalent_auto_delete"] = _declare_twice({}, {"auto_delete": True}, "c.ineq2")
CASES["inequivalent_ttl_value"] = _declare_twice(
    {"arguments": {"x-message-ttl": 1000}}, {"arguments": {"x-message-ttl": 2000}}, "c.ineq3"
)
CASES["inequivalent_ttl_missing"] = _declare_twice(
    {"arguments": {"x-message-ttl": 1000}}, {}, "c.ineq4"
)
CASES["inequivalent_ttl_added"] = _declare_twice(
    {}, {"arguments": {"x-message-ttl": 1000}}, "c.ineq5"
)
CASES["inequivalent_dlx_string"] = _declare_twice(
    {"arguments": {"x-dead-letter-exchange": "a"}},
    {"arguments": {"x-dead-letter-exchange": "b"}},
    "c.ineq6",
)
CASES["inequivalent_queue_type"] = _declare_twice(
    {"durable": True},
    {"durable": True, "arguments": {"x-queue-type": "quorum"}},
    "c.ineq7",
)


def _exchange_twice(first: dict[str, Any], second: dict[str, Any]) -> Case:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.ex", **first)
        ch.exchange_declare("c.ex", **second)

    return _channel_case(body, exchanges=("c.ex",))


CASES["inequivalent_exchange_type"] = _exchange_twice(
    {"exchange_type": "direct"}, {"exchange_type": "fanout"}
)
CASES["inequivalent_exchange_durable"] = _exchange_twice({}, {"durable": True})
CASES["inequivalent_exchange_internal"] = _exchange_twice({}, {"internal": True})


# -- 403 ------------------------------------------------------------------------------------------


@case
def case_declare_default_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("")

    return _channel_case(body)(host, port)


@case
def case_delete_default_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_delete("")

    return _channel_case(body)(host, port)


@case
def case_bind_default_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.binddef")
        ch.queue_bind("c.binddef", "", "rk")

    return _channel_case(body, queues=("c.binddef",))(host, port)


@case
def case_declare_amq_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("amq.c-custom")

    return _channel_case(body)(host, port)


@case
def case_delete_amq_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_delete("amq.direct")

    return _channel_case(body)(host, port)


@case
def case_declare_amq_queue(host: str, port: int) -> Answer:
    return _declare("amq.c-queue")(host, port)


@case
def case_publish_internal_exchange(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.internal", internal=True)
        ch.basic_publish("c.internal", "rk", b"x")

    return _channel_case(body, exchanges=("c.internal",))(host, port)


@case
def case_exclusive_consumer_taken(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.exclcons")
        ch.basic_consume("c.exclcons", lambda *_: None, exclusive=True)
        other = _conn.channel()
        other.basic_consume("c.exclcons", lambda *_: None)

    return _channel_case(body, queues=("c.exclcons",))(host, port)


@case
def case_consume_beside_consumers_exclusively(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.exclcons2")
        ch.basic_consume("c.exclcons2", lambda *_: None)
        other = _conn.channel()
        other.basic_consume("c.exclcons2", lambda *_: None, exclusive=True)

    return _channel_case(body, queues=("c.exclcons2",))(host, port)


@case
def case_login_refused(host: str, port: int) -> Answer:
    try:
        pika.BlockingConnection(_params(host, port, password="wrong")).close()
    except pika.exceptions.AMQPConnectionError as exc:
        return _refused(exc)
    return ["ok"]


# -- 405 ------------------------------------------------------------------------------------------


def _other_connection(queue: str, first: dict[str, Any], second: dict[str, Any]) -> Case:
    def run(host: str, port: int) -> Answer:
        with _connection(host, port) as owner:
            owner.channel().queue_declare(queue, **first)
            return _declare(queue, **second)(host, port)

    return run


CASES["exclusive_declared_elsewhere"] = _other_connection(
    "c.locked", {"exclusive": True}, {"exclusive": True}
)
CASES["exclusive_passive_elsewhere"] = _other_connection(
    "c.locked2", {"exclusive": True}, {"passive": True}
)
CASES["exclusive_mismatch_same_connection"] = _declare_twice({}, {"exclusive": True}, "c.locked3")


@case
def case_exclusive_consume_elsewhere(host: str, port: int) -> Answer:
    with _connection(host, port) as owner:
        owner.channel().queue_declare("c.locked4", exclusive=True)

        def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
            ch.basic_consume("c.locked4", lambda *_: None)

        return _channel_case(body)(host, port)


# -- 530 ------------------------------------------------------------------------------------------


@case
def case_vhost_not_found(host: str, port: int) -> Answer:
    try:
        pika.BlockingConnection(_params(host, port, vhost="c-nope")).close()
    except pika.exceptions.AMQPConnectionError as exc:
        return _refused(exc)
    return ["ok"]


def _consume_twice(raw: RawAMQP) -> None:
    raw.open_channel(1)
    raw.send_method(1, QueueDeclare(queue="c.tag", exclusive=True))
    raw.send_method(1, BasicConsume(queue="c.tag", consumer_tag="c-tag"))
    raw.send_method(1, BasicConsume(queue="c.tag", consumer_tag="c-tag"))


# -- 406 precondition ----------------------------------------------------------------------------


@case
def case_ack_unknown_tag(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_ack(7)

    return _channel_case(body)(host, port)


@case
def case_double_ack(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.ack")
        ch.basic_publish("", "c.ack", b"x")
        method, _, _ = ch.basic_get("c.ack")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        ch.basic_ack(method.delivery_tag)

    return _channel_case(body, queues=("c.ack",))(host, port)


@case
def case_nack_unknown_tag(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_nack(3)

    return _channel_case(body)(host, port)


@case
def case_reject_unknown_tag(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_reject(3)

    return _channel_case(body)(host, port)


@case
def case_delete_queue_if_unused(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.inuse")
        ch.basic_consume("c.inuse", lambda *_: None)
        _conn.channel().queue_delete("c.inuse", if_unused=True)

    return _channel_case(body, queues=("c.inuse",))(host, port)


@case
def case_delete_queue_if_empty(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.notempty")
        ch.basic_publish("", "c.notempty", b"x")
        ch.queue_declare("c.notempty", passive=True)
        ch.queue_delete("c.notempty", if_empty=True)

    return _channel_case(body, queues=("c.notempty",))(host, port)


@case
def case_delete_exchange_if_unused(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.exinuse")
        ch.queue_declare("c.exinuseq")
        ch.queue_bind("c.exinuseq", "c.exinuse", "rk")
        ch.exchange_delete("c.exinuse", if_unused=True)

    return _channel_case(body, queues=("c.exinuseq",), exchanges=("c.exinuse",))(host, port)


@case
def case_tx_commit_without_select(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.tx_commit()

    return _channel_case(body)(host, port)


@case
def case_tx_rollback_without_select(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.tx_rollback()

    return _channel_case(body)(host, port)


@case
def case_confirm_after_tx(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.tx_select()
        ch.confirm_delivery()

    return _channel_case(body)(host, port)


@case
def case_tx_after_confirm(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.confirm_delivery()
        ch.tx_select()

    return _channel_case(body)(host, port)


@case
def case_reply_to_without_consumer(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        props = pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
        ch.basic_publish("", "c.nobody", b"x", props)

    return _channel_case(body)(host, port)


@case
def case_reply_to_consumer_acking(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *_: None, auto_ack=False)

    return _channel_case(body)(host, port)


@case
def case_headers_bad_x_match(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.hdr")
        ch.queue_bind("c.hdr", "amq.headers", arguments={"x-match": "some"})

    return _channel_case(body, queues=("c.hdr",))(host, port)


@case
def case_consume_priority_string(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.prio")
        ch.basic_consume("c.prio", lambda *_: None, arguments={"x-priority": "high"})

    return _channel_case(body, queues=("c.prio",))(host, port)


# -- x-* argument validation (406) ----------------------------------------------------------------

_BAD_ARGUMENTS: dict[str, dict[str, Any]] = {
    "max_length_negative": {"x-max-length": -1},
    "max_length_string": {"x-max-length": "10"},
    "max_length_bytes_negative": {"x-max-length-bytes": -1},
    "message_ttl_string": {"x-message-ttl": "1000"},
    "message_ttl_negative": {"x-message-ttl": -1},
    "expires_zero": {"x-expires": 0},
    "expires_string": {"x-expires": "1000"},
    "max_priority_too_large": {"x-max-priority": 256},
    "max_priority_negative": {"x-max-priority": -1},
    "overflow_bad": {"x-overflow": "drop-tail"},
    "overflow_int": {"x-overflow": 1},
    "queue_mode_bad": {"x-queue-mode": "fast"},
    "queue_type_unknown": {"x-queue-type": "fancy"},
    "dead_letter_routing_key_alone": {"x-dead-letter-routing-key": "rk"},
    "dead_letter_exchange_int": {"x-dead-letter-exchange": 1},
    "single_active_consumer_int": {"x-single-active-consumer": 1},
    "delivery_limit_string": {"x-delivery-limit": "5"},
}
for _name, _arguments in _BAD_ARGUMENTS.items():
    CASES[f"arg_{_name}"] = _args(f"c.arg.{_name}", _arguments)

# -- queue types ------------------------------------------------------------------------------------

_QUORUM = {"x-queue-type": "quorum"}
CASES["quorum_non_durable"] = _args("c.qq1", _QUORUM)
CASES["quorum_exclusive"] = _args("c.qq2", _QUORUM, durable=True, exclusive=True)
CASES["quorum_auto_delete"] = _args("c.qq3", _QUORUM, durable=True, auto_delete=True)
CASES["quorum_max_priority"] = _args("c.qq4", {**_QUORUM, "x-max-priority": 5}, durable=True)
CASES["quorum_queue_mode"] = _args("c.qq5", {**_QUORUM, "x-queue-mode": "lazy"}, durable=True)
CASES["quorum_overflow_reject_publish_dlx"] = _args(
    "c.qq6", {**_QUORUM, "x-overflow": "reject-publish-dlx"}, durable=True
)
CASES["quorum_message_ttl"] = _args("c.qq7", {**_QUORUM, "x-message-ttl": 1000}, durable=True)
CASES["quorum_delivery_limit"] = _args("c.qq8", {**_QUORUM, "x-delivery-limit": 3}, durable=True)
CASES["quorum_dead_letter_strategy"] = _args(
    "c.qq9",
    {
        **_QUORUM,
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    },
    durable=True,
)
CASES["quorum_dead_letter_strategy_bad"] = _args(
    "c.qq10", {**_QUORUM, "x-dead-letter-strategy": "exactly-once"}, durable=True
)
CASES["quorum_delivery_limit_negative"] = _args(
    "c.qq11", {**_QUORUM, "x-delivery-limit": -1}, durable=True
)
CASES["quorum_redeclare_as_classic"] = _declare_twice(
    {"durable": True, "arguments": _QUORUM},
    {"durable": True, "arguments": {"x-queue-type": "classic"}},
    "c.qq13",
)
CASES["quorum_redeclare_without_type"] = _declare_twice(
    {"durable": True, "arguments": _QUORUM}, {"durable": True}, "c.qq14"
)
CASES["quorum_passive"] = _declare_twice(
    {"durable": True, "arguments": _QUORUM}, {"passive": True}, "c.qq15"
)
CASES["stream_non_durable"] = _args("c.sq1", {"x-queue-type": "stream"})
CASES["stream_exclusive"] = _args(
    "c.sq2", {"x-queue-type": "stream"}, durable=True, exclusive=True
)
CASES["stream_max_age_bad"] = _args(
    "c.sq4", {"x-queue-type": "stream", "x-max-age": "1x"}, durable=True
)
CASES["stream_max_priority"] = _args(
    "c.sq3", {"x-queue-type": "stream", "x-max-priority": 5}, durable=True
)


# -- 503 / 540 / 504 / 505 / 501 -----------------------------------------------------------------


@case
def case_exchange_type_unknown(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.badtype", exchange_type="c-fancy")

    return _channel_case(body)(host, port)


@case
def case_qos_prefetch_size(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_qos(prefetch_size=1)

    return _channel_case(body)(host, port)


@case
def case_publish_immediate(host: str, port: int) -> Answer:
    def run(host: str, port: int) -> Answer:
        with RawAMQP(host, port) as raw:
            raw.handshake()
            raw.open_channel(1)
            raw.publish(1, "", "c.nowhere", b"x", immediate=True)
            return _close(raw)

    return run(host, port)


@case
def case_recover_requeue_false(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_recover(requeue=False)

    return _channel_case(body)(host, port)


def _close(raw: RawAMQP) -> Answer:
    """The first channel.close or connection.close the broker sends (after ``raw`` provoked
    one), answered."""
    while True:
        got = raw.next_frame()
        method = got.method if got.type == FRAME_METHOD else None
        if isinstance(method, ChannelClose | ConnectionClose):
            return [method.reply_code, method.reply_text]


def _raw_case(provoke: Callable[[RawAMQP], object]) -> Case:
    def run(host: str, port: int) -> Answer:
        with RawAMQP(host, port) as raw:
            raw.handshake()
            provoke(raw)
            try:
                return _close(raw)
            except SocketClosed:
                return ["socket closed"]
            except TimeoutError:
                return ["no answer"]

    return run


CASES["reuse_consumer_tag"] = _raw_case(_consume_twice)


CASES["channel_flow_inactive"] = _raw_case(
    lambda raw: (raw.open_channel(1), raw.send(method_frame(1, 20, 20, b"\x00")))
)
CASES["method_on_unopened_channel"] = _raw_case(
    lambda raw: raw.send_method(3, QueueDeclare(queue="c.raw", exclusive=True))
)
CASES["channel_reopened"] = _raw_case(
    lambda raw: (raw.open_channel(1), raw.send_method(1, ChannelOpen()))
)
CASES["body_without_header"] = _raw_case(
    lambda raw: (raw.open_channel(1), raw.send(body_frame(1, b"x")))
)
CASES["method_during_content"] = _raw_case(
    lambda raw: (
        raw.open_channel(1),
        raw.send_method(1, BasicPublish(exchange="", routing_key="c.x")),
        raw.send_method(1, QueueDeclare(queue="c.raw", exclusive=True)),
    )
)
CASES["bad_frame_end"] = _raw_case(lambda raw: raw.send(frame(FRAME_METHOD, 0, b"\x00\x0a\x00\x32", end=0)))
CASES["unknown_frame_type"] = _raw_case(lambda raw: raw.send(frame(9, 0, b"")))
CASES["unknown_method"] = _raw_case(
    lambda raw: (raw.open_channel(1), raw.send(method_frame(1, 50, 99)))
)
CASES["channel_method_on_channel_zero"] = _raw_case(
    lambda raw: raw.send_method(0, QueueDeclare(queue="c.raw", exclusive=True))
)
CASES["frame_too_large"] = _raw_case(
    lambda raw: (
        raw.open_channel(1),
        raw.send(
            method_frame(
                1, 50, 10, method_arguments(QueueDeclare(queue="c.raw")) + b"\x00" * 200_000
            )
        ),
    )
)


def capabilities(host: str, port: int) -> dict[str, Any]:
    """The ``capabilities`` table of the broker's ``connection.start``, as pika saw it."""
    with _connection(host, port) as conn:
        table: dict[str, Any] = conn._impl.server_properties["capabilities"]
        return dict(sorted(table.items()))


def capture(host: str, port: int, names: list[str] | None = None) -> dict[str, Answer]:
    """Every case's answer from the broker at ``host:port``."""
    return {name: CASES[name](host, port) for name in (names or list(CASES))}


def capture_table(host: str, port: int) -> dict[str, Any]:
    """What ``rabbitmq_replies.json`` holds, from the broker at ``host:port``."""
    return {"capabilities": capabilities(host, port), "replies": capture(host, port)}


def load_table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(TABLE.read_text())
    return table


if __name__ == "__main__":  # python tests/compat/reply_cases.py PORT: print a broker's table
    import sys

    print(json.dumps(capture_table("127.0.0.1", int(sys.argv[1])), indent=1))
