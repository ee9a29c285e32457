"""A consumer group's committed offset is a settled prefix (pika over loopback): it never moves
past a delivery its reader has not acked, so the next reader of the partition gets every
unacked message again, however the acks came."""

from __future__ import annotations

import httpx
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(60)

GROUP = {"x-stream-group": "g", "x-stream-offset": "first"}


def read(ch: BlockingChannel, count: int) -> list[tuple[int, int]]:
    """(offset, delivery tag) of the next ``count`` deliveries of the group's reader."""
    got: list[tuple[int, int]] = []
    for method, properties, _body in ch.consume("gs", arguments=GROUP, inactivity_timeout=3):
        assert method is not None, f"only {got} came"
        got.append((properties.headers["x-stream-offset"], method.delivery_tag))
        if len(got) == count:
            break
    return got


def test_the_committed_offset_stops_at_the_first_unacked_delivery(
    tqbroker_thread: RunningBroker,
) -> None:
    first = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    ch = first.channel()
    ch.queue_declare("gs", durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for n in range(8):
        ch.basic_publish("", "gs", b"%d" % n, pika.BasicProperties(delivery_mode=2))
    ch.basic_qos(prefetch_count=5)
    delivered = read(ch, 5)
    assert [offset for offset, _tag in delivered] == [0, 1, 2, 3, 4]
    for offset, tag in delivered:
        if offset in (0, 1, 3):  # 2 and 4 stay unacked
            ch.basic_ack(tag)
    first.process_data_events(0.3)
    with httpx.Client(base_url=tqbroker_thread.http_url, auth=("guest", "guest")) as http:
        group = http.get("/topics/gs/groups/g").json()
    assert group["partitions"][0]["committed"] == 2
    first.close()  # its unacked deliveries go back to the group

    second = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    ch = second.channel()
    ch.basic_qos(prefetch_count=10)
    assert [offset for offset, _tag in read(ch, 6)] == [2, 3, 4, 5, 6, 7]
    second.close()


def test_a_requeue_by_the_groups_reader_delivers_it_again(tqbroker_thread: RunningBroker) -> None:
    """Unlike a plain stream consumer, a group's reader that requeues (nack) gets the message
    again: the group has not processed it."""
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    ch = connection.channel()
    ch.queue_declare("gs", durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for n in range(4):
        ch.basic_publish("", "gs", b"%d" % n, pika.BasicProperties(delivery_mode=2))
    ch.basic_qos(prefetch_count=1)
    seen: list[int] = []
    for method, properties, _body in ch.consume("gs", arguments=GROUP, inactivity_timeout=3):
        assert method is not None, f"only {seen} came"
        offset = properties.headers["x-stream-offset"]
        seen.append(offset)
        if offset == 2 and seen.count(2) == 1:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
        if len(seen) == 5:
            break
    assert seen == [0, 1, 2, 2, 3]
    connection.close()
