"""RabbitMQ queue features as pika users write them, over real sockets and the real clock (short
TTLs): a retry queue built from TTL + dead-lettering, per-message expiry, bounded queues that
dead-letter what they refuse, priority queues, poison messages and the consumer timeout. Durable
variants run on the durable backend (``nox -s backends`` reruns them on RocksDB); transient ones
on the memory backend. Time-heavy cases use MockClock in tests/broker/test_queue_semantics.py."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.polling import eventually
from tqbroker import BrokerConfig
from tqbroker.testing import running_broker

pytestmark = pytest.mark.timeout(60)

DURABILITY = pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])


def props(durable: bool, **kwargs: object) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2 if durable else 1, **kwargs)


def drain(ch: BlockingChannel, queue: str) -> list[tuple[bytes, pika.BasicProperties]]:
    got: list[tuple[bytes, pika.BasicProperties]] = []
    while True:
        method, properties, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, properties))


@DURABILITY
def test_retry_queue_from_ttl_and_dead_lettering(channel: BlockingChannel, durable: bool) -> None:
    """The classic RabbitMQ retry pattern: the worker rejects, the message waits in a TTL queue,
    then comes back; x-death tells the worker how often it failed."""
    channel.queue_declare(
        "jobs",
        durable=durable,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "jobs.retry"},
    )
    channel.queue_declare(
        "jobs.retry",
        durable=durable,
        arguments={
            "x-message-ttl": 150,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "jobs",
        },
    )
    channel.basic_publish("", "jobs", b"flaky job", props(durable))
    attempts: list[float] = []
    deaths_seen: list[int] = []

    def on_message(
        ch: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        attempts.append(time.monotonic())
        deaths = (properties.headers or {}).get("x-death", [])
        deaths_seen.append(sum(d["count"] for d in deaths if d["reason"] == "rejected"))
        if len(attempts) < 3:
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)
            ch.stop_consuming()

    channel.basic_consume("jobs", on_message)
    channel.start_consuming()
    assert deaths_seen == [0, 1, 2]
    assert attempts[1] - attempts[0] >= 0.14
    assert attempts[2] - attempts[1] >= 0.14
    assert channel.queue_declare("jobs", passive=True).method.message_count == 0


@DURABILITY
def test_expired_message_is_never_delivered(channel: BlockingChannel, durable: bool) -> None:
    channel.queue_declare("ttl", durable=durable, arguments={"x-dead-letter-exchange": "dlx"})
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("expired")
    channel.queue_bind("expired", "dlx")
    channel.basic_publish("", "ttl", b"short-lived", props(durable, expiration="100"))
    channel.basic_publish("", "ttl", b"long-lived", props(durable, expiration="60000"))
    eventually(lambda: channel.queue_declare("ttl", passive=True).method.message_count == 1)
    assert [body for body, _ in drain(channel, "ttl")] == [b"long-lived"]
    [(body, properties)] = drain(channel, "expired")
    assert body == b"short-lived"
    assert properties.expiration is None
    [death] = properties.headers["x-death"]
    assert death["reason"] == "expired"
    assert death["queue"] == "ttl"
    assert death["original-expiration"] == "100"


def test_invalid_expiration_closes_the_channel_with_406(channel: BlockingChannel) -> None:
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"x", pika.BasicProperties(expiration="soon"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("q", passive=True)
    assert closed.value.reply_code == 406
    assert "invalid expiration" in closed.value.reply_text


@DURABILITY
def test_bounded_queue_nacks_and_dead_letters_with_reject_publish_dlx(
    channel: BlockingChannel, durable: bool
) -> None:
    channel.queue_declare("overflow")
    channel.queue_declare(
        "bounded",
        durable=durable,
        arguments={
            "x-max-length-bytes": 10,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "overflow",
        },
    )
    channel.confirm_delivery()
    channel.basic_publish("", "bounded", b"0123456789", props(durable))
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "bounded", b"one byte too many", props(durable))
    assert [body for body, _ in drain(channel, "bounded")] == [b"0123456789"]
    [(body, properties)] = drain(channel, "overflow")
    assert body == b"one byte too many"
    assert properties.headers["x-death"][0]["reason"] == "maxlen"


@DURABILITY
def test_priority_queue_delivers_highest_priority_first(
    channel: BlockingChannel, durable: bool
) -> None:
    channel.queue_declare("urgent-first", durable=durable, arguments={"x-max-priority": 10})
    for body, priority in ((b"low", 1), (b"none", None), (b"high", 9), (b"mid", 5), (b"high2", 9)):
        channel.basic_publish("", "urgent-first", body, props(durable, priority=priority))
    channel.basic_qos(prefetch_count=1)
    received = []
    for method, _properties, body in channel.consume("urgent-first", inactivity_timeout=1):
        if method is None:
            break
        received.append(body)
        channel.basic_ack(method.delivery_tag)
    assert received == [b"high", b"high2", b"mid", b"low", b"none"]


@DURABILITY
def test_poison_message_goes_to_the_dead_letter_queue_after_the_delivery_limit(
    channel: BlockingChannel, durable: bool
) -> None:
    channel.queue_declare("poison")
    channel.queue_declare(
        "work",
        durable=durable,
        arguments={
            "x-delivery-limit": 2,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "poison",
        },
    )
    channel.basic_publish("", "work", b"crashes the worker", props(durable))
    counts = []
    for _ in range(3):
        method, properties, _body = channel.basic_get("work")
        assert method is not None
        counts.append((properties.headers or {}).get("x-delivery-count"))
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [None, 1, 2]
    assert channel.basic_get("work")[0] is None
    [(body, properties)] = drain(channel, "poison")
    assert body == b"crashes the worker"
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"


def test_consumer_timeout_closes_the_channel_and_requeues(channel: BlockingChannel) -> None:
    channel.queue_declare("slow", arguments={"x-consumer-timeout": 200})
    channel.basic_publish("", "slow", b"takes too long")
    received = []
    channel.basic_consume("slow", lambda ch, m, p, body: received.append(body))
    channel.connection.process_data_events(time_limit=0.1)
    time.sleep(0.4)  # past the timeout without acking
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("slow", passive=True)
    assert received == [b"takes too long"]
    assert closed.value.reply_code == 406
    assert "delivery acknowledgement on channel" in closed.value.reply_text
    assert "200 ms" in closed.value.reply_text
    ch = channel.connection.channel()  # the connection lives on; the message is back
    method, _properties, body = ch.basic_get("slow", auto_ack=True)
    assert method is not None
    assert method.redelivered
    assert body == b"takes too long"


def test_broker_wide_consumer_timeout() -> None:
    with running_broker(BrokerConfig(port=0, consumer_timeout_ms=200)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = connection.channel()
        ch.queue_declare("q")
        ch.basic_publish("", "q", b"m")
        method, _properties, _body = ch.basic_get("q")  # unacked basic.get counts too
        assert method is not None
        time.sleep(0.4)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.queue_declare("q", passive=True)
        assert closed.value.reply_code == 406
        connection.close()


def test_ttl_counts_from_the_original_publish_across_a_restart() -> None:
    """A durable queue's persistent messages keep their arrival time in storage: after a
    restart, their TTL still runs from when they were published; priorities survive too."""
    with tempfile.TemporaryDirectory() as data_dir:
        config = BrokerConfig(port=0, data_dir=Path(data_dir))
        with running_broker(config) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = connection.channel()
            ch.queue_declare("ttl", durable=True, arguments={"x-message-ttl": 2000})
            ch.queue_declare("prio", durable=True, arguments={"x-max-priority": 3})
            ch.confirm_delivery()
            ch.basic_publish("", "ttl", b"expires", props(True))
            published = time.monotonic()  # confirmed: the broker took its arrival time before
            for body, priority in ((b"a", 0), (b"c", 3), (b"b", 2)):
                ch.basic_publish("", "prio", body, props(True, priority=priority))
            connection.close()
        # Down for a while: a TTL counted again from the restart would run past the check below.
        time.sleep(max(0.0, published + 0.8 - time.monotonic()))
        with running_broker(config) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = connection.channel()
            assert [body for body, _ in drain(ch, "prio")] == [b"c", b"b", b"a"]
            assert ch.queue_declare("ttl", passive=True).method.message_count == 1
            time.sleep(max(0.0, published + 2.4 - time.monotonic()))
            assert ch.queue_declare("ttl", passive=True).method.message_count == 0
            connection.close()


@DURABILITY
def test_bounded_queue_keeps_up_with_a_consumer(channel: BlockingChannel, durable: bool) -> None:
    """A full-speed burst into a one-message queue with reject-publish: a consumer with credit
    takes every message, none is nacked (RabbitMQ delivers before it counts the limit)."""
    args = {"x-max-length": 1, "x-overflow": "reject-publish"}
    channel.queue_declare("narrow", durable=durable, arguments=args)
    consumer_connection = pika.BlockingConnection(channel.connection._impl.params)
    consumer = consumer_connection.channel()
    consumer.basic_qos(prefetch_count=1000)
    received: list[bytes] = []
    consumer.basic_consume("narrow", lambda ch, m, p, body: received.append(body), auto_ack=True)
    channel.confirm_delivery()
    for n in range(100):
        channel.basic_publish("", "narrow", b"%d" % n, props(durable))  # NackError if refused
    deadline = time.monotonic() + 5
    while len(received) < 100 and time.monotonic() < deadline:
        consumer_connection.process_data_events(time_limit=0.05)
    assert received == [b"%d" % n for n in range(100)]
    consumer_connection.close()


def test_consumer_argument_sets_the_consumer_timeout(channel: BlockingChannel) -> None:
    channel.queue_declare("patient")  # no queue timeout; the broker default is 30 minutes
    channel.basic_publish("", "patient", b"m")
    channel.basic_consume("patient", lambda *_args: None, arguments={"x-consumer-timeout": 200})
    channel.connection.process_data_events(time_limit=0.1)
    time.sleep(0.4)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("patient", passive=True)
    assert closed.value.reply_code == 406
    assert "200 ms" in closed.value.reply_text


def test_nack_multiple_and_transactions_dead_letter_on_commit(channel: BlockingChannel) -> None:
    channel.queue_declare("rejects")
    channel.queue_declare(
        "tasks", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "rejects"}
    )
    for n in range(4):
        channel.basic_publish("", "tasks", b"%d" % n)
    tags = [channel.basic_get("tasks")[0].delivery_tag for _ in range(4)]
    channel.basic_nack(tags[1], multiple=True, requeue=False)  # "0" and "1"
    assert [body for body, _ in drain(channel, "rejects")] == [b"0", b"1"]
    channel.tx_select()
    channel.basic_reject(tags[2], requeue=False)
    channel.tx_rollback()  # nothing happened: "2" is still unacked
    assert drain(channel, "rejects") == []
    channel.basic_reject(tags[2], requeue=False)
    channel.basic_reject(tags[3], requeue=False)
    assert drain(channel, "rejects") == []  # not before the commit
    channel.tx_commit()
    assert [body for body, _ in drain(channel, "rejects")] == [b"2", b"3"]
