"""pika (BlockingConnection) against the broker: the first things a user tries."""

from __future__ import annotations

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.testing import RunningBroker


@pytest.fixture
def channel(tqbroker_thread: RunningBroker):
    conn = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    yield conn.channel()
    if conn.is_open:
        conn.close()


def test_publish_then_get(channel: BlockingChannel) -> None:
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"hello", pika.BasicProperties(content_type="text/plain"))
    method, props, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"hello"
    assert props.content_type == "text/plain"
    assert method.message_count == 0
