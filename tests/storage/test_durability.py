"""What survives a restart: durable definitions and persistent messages on durable queues;
transient and exclusive ones do not (RabbitMQ's rules)."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker


def connect(url: str) -> pika.adapters.blocking_connection.BlockingChannel:
    return pika.BlockingConnection(pika.URLParameters(url)).channel()


def test_definitions_and_persistent_messages_survive_a_clean_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path)
    with running_broker(config) as broker:
        ch = connect(broker.url)
        ch.confirm_delivery()
        ch.exchange_declare("orders", "topic", durable=True)
        ch.exchange_declare("scratch", "fanout", durable=False)
        ch.queue_declare("durable-q", durable=True, arguments={"x-max-priority-ignored": 1})
        ch.queue_declare("transient-q", durable=False)
        ch.queue_bind("durable-q", "orders", "eu.#")
        ch.queue_bind("transient-q", "orders", "us.#")
        persistent = pika.BasicProperties(delivery_mode=2, headers={"n": 1})
        for i in range(100):
            ch.basic_publish("orders", "eu.fr", b"p%d" % i, persistent)
        ch.basic_publish("orders", "eu.de", b"transient", pika.BasicProperties(delivery_mode=1))
        ch.basic_publish("orders", "us.ny", b"to-transient-q", persistent)
        # Take two, ack one: the unacked one comes back flagged redelivered.
        first = ch.basic_get("durable-q")
        ch.basic_ack(first[0].delivery_tag)
        ch.basic_get("durable-q")
        ch.connection.close()

    with running_broker(config) as broker:
        ch = connect(broker.url)
        ok = ch.queue_declare("durable-q", passive=True)
        assert ok.method.message_count == 99  # the transient message is gone
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.queue_declare("transient-q", passive=True)
        assert missing.value.reply_code == 404
        ch = ch.connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.exchange_declare("scratch", passive=True)
        ch = ch.connection.channel()
        ch.exchange_declare("orders", passive=True)
        bodies = []
        redelivered = []
        while True:
            method, props, body = ch.basic_get("durable-q", auto_ack=True)
            if method is None:
                break
            bodies.append(body)
            redelivered.append(method.redelivered)
            assert props.headers == {"n": 1}
        assert bodies == [b"p%d" % i for i in range(1, 100)]
        assert redelivered == [True] + [False] * 98
        # The binding survived: routing still works.
        ch.basic_publish("orders", "eu.it", b"after restart")
        assert ch.basic_get("durable-q", auto_ack=True)[2] == b"after restart"


def test_exclusive_durable_queue_does_not_survive(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path)
    with running_broker(config) as broker:
        ch = connect(broker.url)
        ch.queue_declare("mine", durable=True, exclusive=True)
        ch.basic_publish("", "mine", b"x", pika.BasicProperties(delivery_mode=2))
    with running_broker(config) as broker:
        ch = connect(broker.url)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.queue_declare("mine", passive=True)
        assert missing.value.reply_code == 404


def test_unknown_queue_backend_is_refused_with_the_installed_list(tmp_path: Path) -> None:
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as broker:
        ch = connect(broker.url)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("q", durable=True, arguments={"x-queue-backend": "tape"})
        assert refused.value.reply_code == 406
        assert "log" in refused.value.reply_text
        assert "memory" in refused.value.reply_text
        ch = ch.connection.channel()
        ch.queue_declare("in-memory", durable=True, arguments={"x-queue-backend": "memory"})
