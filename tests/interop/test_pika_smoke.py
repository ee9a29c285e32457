"""pika (BlockingConnection) against the broker: the first things a user tries."""

from __future__ import annotations

import pika
from pika.adapters.blocking_connection import BlockingChannel


def test_publish_then_get(channel: BlockingChannel) -> None:
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"hello", pika.BasicProperties(content_type="text/plain"))
    method, props, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"hello"
    assert props.content_type == "text/plain"
    assert method.message_count == 0
