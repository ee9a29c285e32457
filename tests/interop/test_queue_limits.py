"""Queue arguments RabbitMQ users set for bounded and self-cleaning queues: ``x-max-length``
with ``x-overflow`` (drop-head, reject-publish) and ``x-expires``, as pika users write them."""

from __future__ import annotations

import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.pikaqueue import drain

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_bounded_queue_rejects_publishers_with_nacks(
    channel: BlockingChannel, durable: bool
) -> None:
    args = {"x-max-length": 3, "x-overflow": "reject-publish"}
    channel.queue_declare("bounded", durable=durable, arguments=args)
    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2 if durable else 1)
    for i in range(3):
        channel.basic_publish("", "bounded", b"%d" % i, props)
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "bounded", b"refused", props)
    assert drain(channel, "bounded") == [b"0", b"1", b"2"]
    channel.basic_publish("", "bounded", b"room again", props)  # acked once there is room
    assert drain(channel, "bounded") == [b"room again"]


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_drop_head_keeps_the_newest_messages(channel: BlockingChannel, durable: bool) -> None:
    channel.queue_declare("newest", durable=durable, arguments={"x-max-length": 2})
    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2 if durable else 1)
    for i in range(5):
        channel.basic_publish("", "newest", b"%d" % i, props)  # all acked: drop-head accepts
    ok = channel.queue_declare("newest", durable=durable, arguments={"x-max-length": 2})
    assert ok.method.message_count == 2
    assert drain(channel, "newest") == [b"3", b"4"]


def test_unused_queue_expires_and_a_used_one_does_not(channel: BlockingChannel) -> None:
    connection = channel.connection
    consumer_ch = connection.channel()
    channel.queue_declare("short-lived", arguments={"x-expires": 300})
    channel.queue_declare("consumed", arguments={"x-expires": 300})
    consumer_ch.basic_consume("consumed", lambda *_args: None, consumer_tag="keeper")
    time.sleep(0.6)
    connection.process_data_events(time_limit=0.1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        channel.queue_declare("short-lived", passive=True)
    assert gone.value.reply_code == 404
    ch = connection.channel()
    ch.queue_declare("consumed", passive=True)  # a consumer keeps it alive
    consumer_ch.basic_cancel("keeper")  # the countdown starts now...
    time.sleep(0.2)
    assert ch.basic_get("consumed", auto_ack=True)[0] is None  # ...and basic.get restarts it
    time.sleep(0.2)
    ch.queue_declare("consumed", passive=True)  # 0.4 s since the cancel, 0.2 s since the get
    time.sleep(0.5)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as expired:
        ch.queue_declare("consumed", passive=True)
    assert expired.value.reply_code == 404
