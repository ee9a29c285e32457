"""``x-queue-type: quorum`` with RabbitMQ 4's quorum-queue semantics on one node, as an
application written for RabbitMQ 4 sees it through pika: declared unchanged, durable only,
``x-delivery-limit`` 20 by default (negative: none), dead-lettered or dropped past it, the type
kept across a restart (a quorum queue is a durable classic queue on the durable backend: no
replication on one node). The refusals' texts are in ``rabbitmq_replies.json`` (cases
``quorum_*``), compared word for word by ``test_reply_texts.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
import trio
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.vhosts import memory_vhost
from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def ch(tqbroker_thread: RunningBroker) -> Iterator[BlockingChannel]:
    params = pika.ConnectionParameters(tqbroker_thread.host, tqbroker_thread.port)
    with pika.BlockingConnection(params) as conn:
        yield conn.channel()


def returns_until_gone(ch: BlockingChannel, queue: str, most: int) -> int:
    """Get the one message and nack it back, until the queue stops handing it out; how many
    times it was delivered."""
    for delivered in range(most + 1):
        method, _, _ = ch.basic_get(queue)
        if method is None:
            return delivered
        ch.basic_nack(method.delivery_tag, requeue=True)
    return most + 1


def test_declare_passive_and_redeclare_unchanged(ch: BlockingChannel) -> None:
    arguments = {
        **QUORUM,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    ch.queue_declare("orders", durable=True, arguments=arguments)
    ch.basic_publish("", "orders", b"x", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare("orders", passive=True).method.message_count == 1
    ch.queue_declare("orders", durable=True, arguments=arguments)


def test_default_delivery_limit_is_20_then_dead_lettered(ch: BlockingChannel) -> None:
    ch.queue_declare("dlq", durable=True)
    dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    ch.queue_declare("work", durable=True, arguments={**QUORUM, **dead_letter})
    ch.basic_publish("", "work", b"poison")
    # Delivered 21 times: returned 20 times is within the limit, the 21st return is not.
    assert returns_until_gone(ch, "work", 30) == 21
    method, _, body = ch.basic_get("dlq", auto_ack=True)
    assert method is not None
    assert body == b"poison"


def test_explicit_delivery_limit_without_dead_letter_exchange_drops(ch: BlockingChannel) -> None:
    ch.queue_declare("limited", durable=True, arguments={**QUORUM, "x-delivery-limit": 2})
    ch.basic_publish("", "limited", b"x")
    assert returns_until_gone(ch, "limited", 10) == 3
    assert ch.queue_declare("limited", passive=True).method.message_count == 0


def test_negative_delivery_limit_means_none(ch: BlockingChannel) -> None:
    ch.queue_declare("unlimited", durable=True, arguments={**QUORUM, "x-delivery-limit": -1})
    ch.basic_publish("", "unlimited", b"x")
    assert returns_until_gone(ch, "unlimited", 25) == 26


def test_classic_queues_keep_no_default_limit(ch: BlockingChannel) -> None:
    ch.queue_declare("plain", durable=True)
    ch.basic_publish("", "plain", b"x")
    assert returns_until_gone(ch, "plain", 25) == 26


def test_a_quorum_queue_stays_one_across_a_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data")
    for run in range(2):
        with running_broker(config) as broker:
            params = pika.ConnectionParameters(broker.host, broker.port)
            with pika.BlockingConnection(params) as conn:
                ch = conn.channel()
                if run == 0:
                    ch.queue_declare("kept", durable=True, arguments=QUORUM)
                    ch.confirm_delivery()
                    ch.basic_publish("", "kept", b"x", pika.BasicProperties(delivery_mode=2))
                    continue
                declared = ch.queue_declare("kept", durable=True, arguments=QUORUM)
                assert declared.method.message_count == 1
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                    ch.queue_declare("kept", durable=True)
                assert closed.value.reply_code == 406
                assert "current is the value 'quorum' of type 'longstr'" in closed.value.reply_text


async def test_the_queue_reports_its_type() -> None:
    """``Queue.queue_type`` (the management API's ``type``): classic, quorum or stream."""
    async with trio.open_nursery() as nursery:
        vhost = memory_vhost(nursery)
        for name, arguments in (("c", {}), ("q", QUORUM)):
            queue = vhost.declare_queue(
                name,
                passive=False,
                durable=True,
                exclusive=False,
                auto_delete=False,
                arguments=arguments,  # type: ignore[arg-type]
                owner=None,
            )
            assert queue.queue_type == ("quorum" if name == "q" else "classic")
            assert queue.arguments.delivery_limit == (20 if name == "q" else None)
        nursery.cancel_scope.cancel()
