"""Reply-text cases: 406 on acks, deletes, tx/confirm modes, direct reply-to, bindings and
consumers; 503, 540 and the frame-level 501/504/505 (see ``reply_cases.py``)."""

from __future__ import annotations

import pika
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support.rawamqp import RawAMQP, body_frame, frame, method_arguments, method_frame
from tqbroker.protocol.frames import FRAME_METHOD
from tqbroker.protocol.methods import (
    BasicPublish,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    QueueDeclare,
)

from .reply_harness import (
    CASES,
    Answer,
    case,
    channel_case,
    raw_case,
    read_close,
)

# -- 406 precondition ----------------------------------------------------------------------------


@case
def case_ack_unknown_tag(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_ack(7)

    return channel_case(body)(host, port)


@case
def case_double_ack(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.ack")
        ch.basic_publish("", "c.ack", b"x")
        method, _, _ = ch.basic_get("c.ack")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        ch.basic_ack(method.delivery_tag)

    return channel_case(body, queues=("c.ack",))(host, port)


@case
def case_nack_unknown_tag(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_nack(3)

    return channel_case(body)(host, port)


@case
def case_reject_unknown_tag(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_reject(3)

    return channel_case(body)(host, port)


@case
def case_delete_queue_if_unused(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.inuse")
        ch.basic_consume("c.inuse", lambda *_: None)
        _conn.channel().queue_delete("c.inuse", if_unused=True)

    return channel_case(body, queues=("c.inuse",))(host, port)


@case
def case_delete_queue_if_empty(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.notempty")
        ch.basic_publish("", "c.notempty", b"x")
        ch.queue_declare("c.notempty", passive=True)
        ch.queue_delete("c.notempty", if_empty=True)

    return channel_case(body, queues=("c.notempty",))(host, port)


@case
def case_delete_exchange_if_unused(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.exinuse")
        ch.queue_declare("c.exinuseq")
        ch.queue_bind("c.exinuseq", "c.exinuse", "rk")
        ch.exchange_delete("c.exinuse", if_unused=True)

    return channel_case(body, queues=("c.exinuseq",), exchanges=("c.exinuse",))(host, port)


@case
def case_tx_commit_without_select(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.tx_commit()

    return channel_case(body)(host, port)


@case
def case_tx_rollback_without_select(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.tx_rollback()

    return channel_case(body)(host, port)


@case
def case_confirm_after_tx(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.tx_select()
        ch.confirm_delivery()

    return channel_case(body)(host, port)


@case
def case_tx_after_confirm(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.confirm_delivery()
        ch.tx_select()

    return channel_case(body)(host, port)


@case
def case_reply_to_without_consumer(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        props = pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
        ch.basic_publish("", "c.nobody", b"x", props)

    return channel_case(body)(host, port)


@case
def case_reply_to_consumer_acking(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *_: None, auto_ack=False)

    return channel_case(body)(host, port)


@case
def case_headers_bad_x_match(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.hdr")
        ch.queue_bind("c.hdr", "amq.headers", arguments={"x-match": "some"})

    return channel_case(body, queues=("c.hdr",))(host, port)


@case
def case_consume_priority_string(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare("c.prio")
        ch.basic_consume("c.prio", lambda *_: None, arguments={"x-priority": "high"})

    return channel_case(body, queues=("c.prio",))(host, port)


# -- 503 / 540 / 504 / 505 / 501 -----------------------------------------------------------------


@case
def case_exchange_type_unknown(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.badtype", exchange_type="c-fancy")

    return channel_case(body)(host, port)


@case
def case_qos_prefetch_size(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_qos(prefetch_size=1)

    return channel_case(body)(host, port)


@case
def case_publish_immediate(host: str, port: int) -> Answer:
    def run(host: str, port: int) -> Answer:
        with RawAMQP(host, port) as raw:
            raw.handshake()
            raw.open_channel(1)
            raw.publish(1, "", "c.nowhere", b"x", immediate=True)
            return read_close(raw)

    return run(host, port)


@case
def case_recover_requeue_false(host: str, port: int) -> Answer:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.basic_recover(requeue=False)

    return channel_case(body)(host, port)


CASES["channel_flow_inactive"] = raw_case(
    lambda raw: raw.open_channel(1), lambda raw: raw.send(method_frame(1, 20, 20, b"\x00"))
)
CASES["method_on_unopened_channel"] = raw_case(
    lambda raw: raw.send_method(3, QueueDeclare(queue="c.raw", exclusive=True))
)
CASES["channel_reopened"] = raw_case(
    lambda raw: raw.open_channel(1), lambda raw: raw.send_method(1, ChannelOpen())
)
CASES["body_without_header"] = raw_case(
    lambda raw: raw.open_channel(1), lambda raw: raw.send(body_frame(1, b"x"))
)
CASES["method_during_content"] = raw_case(
    lambda raw: raw.open_channel(1),
    lambda raw: raw.send_method(1, BasicPublish(exchange="", routing_key="c.x")),
    lambda raw: raw.send_method(1, QueueDeclare(queue="c.raw", exclusive=True)),
)
CASES["bad_frame_end"] = raw_case(
    lambda raw: raw.send(frame(FRAME_METHOD, 0, b"\x00\x0a\x00\x32", end=0))
)
CASES["unknown_frame_type"] = raw_case(lambda raw: raw.send(frame(9, 0, b"")))
CASES["unknown_method"] = raw_case(
    lambda raw: raw.open_channel(1), lambda raw: raw.send(method_frame(1, 50, 99))
)
CASES["channel_method_on_channel_zero"] = raw_case(
    lambda raw: raw.send_method(0, QueueDeclare(queue="c.raw", exclusive=True))
)
CASES["frame_too_large"] = raw_case(
    lambda raw: raw.open_channel(1),
    lambda raw: raw.send(
        method_frame(1, 50, 10, method_arguments(QueueDeclare(queue="c.raw")) + b"\x00" * 200_000)
    ),
)


@case
def case_channel_number_above_channel_max(host: str, port: int) -> Answer:
    """channel.open on a number above the negotiated channel_max (2047 for both brokers)."""
    with RawAMQP(host, port) as raw:
        raw.handshake()
        raw.send_method(2048, ChannelOpen())
        got = raw.next_frame().method
        if isinstance(got, ChannelOpenOk):
            return ["ok"]
        assert isinstance(got, ConnectionClose), got
        return [got.reply_code, got.reply_text]
