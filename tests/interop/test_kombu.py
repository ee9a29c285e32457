"""kombu against the broker, through both the ``pyamqp://`` transport and the default ``amqp://``
one (which picks py-amqp too when librabbitmq is not installed)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.message import Message

from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=["pyamqp", "amqp"])
def conn(request: pytest.FixtureRequest, tqbroker_thread: RunningBroker) -> Iterator[Connection]:
    url = f"{request.param}://guest:guest@{tqbroker_thread.host}:{tqbroker_thread.port}//"
    with Connection(url, connect_timeout=5) as connection:
        connection.ensure_connection(max_retries=1)
        yield connection


def drain(conn: Connection, until: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("timed out waiting for messages")
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=min(remaining, 0.2))


def drain_quietly(conn: Connection, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.05)


def test_transport_is_py_amqp(conn: Connection) -> None:
    assert conn.transport.driver_type == "amqp"
    assert conn.connected
    server = conn.connection.server_properties
    assert server["product"] == "tqbroker"
    assert server["capabilities"]["publisher_confirms"] is True


def test_producer_consumer_with_exchange_and_queue(conn: Connection) -> None:
    media = Exchange("media", type="direct", durable=True)
    video = Queue("video", exchange=media, routing_key="video", durable=True)
    audio = Queue("audio", exchange=media, routing_key="audio", durable=True)

    producer = Producer(conn.channel(), exchange=media, serializer="json")
    for i in range(5):
        producer.publish(
            {"name": f"clip{i}.mp4", "size": i * 100},
            routing_key="video",
            declare=[video, audio],
            headers={"origin": "test"},
            retry=True,
        )
    producer.publish({"name": "song.mp3"}, routing_key="audio")

    got: list[tuple[dict[str, object], str, bool]] = []

    def on_message(body: dict[str, object], message: Message) -> None:
        got.append((body, message.headers["origin"], message.delivery_info["redelivered"]))
        message.ack()

    with Consumer(conn.channel(), queues=[video], callbacks=[on_message], accept=["json"]):
        drain(conn, lambda: len(got) == 5)
        drain_quietly(conn, 0.2)

    assert got == [({"name": f"clip{i}.mp4", "size": i * 100}, "test", False) for i in range(5)]
    channel = conn.channel()
    assert video.bind(channel).queue_declare(passive=True).message_count == 0
    assert audio.bind(channel).queue_declare(passive=True).message_count == 1


def test_topic_exchange_and_requeue(conn: Connection) -> None:
    events = Exchange("kombu.events", type="topic")
    orders = Queue("kombu.orders", exchange=events, routing_key="order.#", auto_delete=False)
    producer = Producer(conn.channel(), exchange=events, serializer="json")
    for key in ("order.created", "user.created", "order.eu.paid"):
        producer.publish({"key": key}, routing_key=key, declare=[orders])

    got: list[tuple[str, bool]] = []

    def on_message(body: dict[str, str], message: Message) -> None:
        redelivered = message.delivery_info["redelivered"]
        got.append((body["key"], redelivered))
        if body["key"] == "order.created" and not redelivered:
            message.requeue()
        else:
            message.ack()

    with Consumer(conn.channel(), queues=[orders], callbacks=[on_message], accept=["json"]):
        drain(conn, lambda: len(got) == 3)
        drain_quietly(conn, 0.2)

    assert sorted(got) == [
        ("order.created", False),
        ("order.created", True),
        ("order.eu.paid", False),
    ]
    assert got[0] == ("order.created", False)


def test_fanout_broadcast_to_several_queues(conn: Connection) -> None:
    bcast = Exchange("kombu.bcast", type="fanout", auto_delete=True)
    queues = [Queue(f"kombu.bcast.{i}", exchange=bcast, exclusive=True) for i in range(3)]
    channel = conn.channel()
    for queue in queues:
        queue.bind(channel).declare()
    producer = Producer(channel, exchange=bcast)
    producer.publish("hello all", routing_key="", serializer="json")

    for queue in queues:
        message = queue.bind(channel).get(no_ack=True, accept=["json"])
        assert message is not None
        assert message.payload == "hello all"
        assert queue.bind(channel).get(no_ack=True) is None


def test_simple_queue_put_get(conn: Connection) -> None:
    with conn.SimpleQueue("kombu.simple") as q:
        for i in range(3):
            q.put({"n": i})
        assert q.qsize() == 3
        received = []
        for _ in range(3):
            message = q.get(block=True, timeout=5)
            received.append(message.payload)
            message.ack()
        assert received == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert q.qsize() == 0
        with pytest.raises(q.Empty):
            q.get_nowait()
        with pytest.raises(q.Empty):
            q.get(block=True, timeout=0.3)


def test_simple_buffer_raw_bytes(conn: Connection) -> None:
    payload = bytes(range(256)) * 1000
    with conn.SimpleBuffer("kombu.buffer") as q:
        q.put(payload)
        message = q.get(timeout=5)
        assert message.body == payload


def test_publisher_confirms_with_pyamqp(conn: Connection) -> None:
    """kombu's ``confirm_publish`` transport option (used by Celery) puts the channel in confirm
    mode: publish blocks until acked and raises on a returned mandatory message."""
    url = conn.as_uri(include_password=True)
    with Connection(url, transport_options={"confirm_publish": True}) as confirming:
        queue = Queue("kombu.confirmed")
        producer = Producer(confirming.channel(), serializer="json")
        for i in range(10):
            producer.publish({"i": i}, routing_key="kombu.confirmed", declare=[queue])
        channel = confirming.channel()
        assert queue.bind(channel).queue_declare(passive=True).message_count == 10
        q = confirming.SimpleQueue("kombu.confirmed")
        try:
            got = []
            for _ in range(10):
                message = q.get(timeout=5)
                got.append(message.payload["i"])
                message.ack()
            assert got == list(range(10))
        finally:
            q.close()
