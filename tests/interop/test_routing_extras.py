"""RabbitMQ extensions to routing and consuming: sender-selected distribution (CC/BCC headers),
consumer priorities (``x-priority``) and single active consumer (``x-single-active-consumer``),
as pika users write them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def conn(tqbroker_thread: RunningBroker) -> Iterator[BlockingConnection]:
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    yield connection
    if connection.is_open:
        connection.close()


def pump(conn: BlockingConnection, done: Callable[[], bool], timeout: float = 5.0) -> None:
    """Process events until ``done()`` (pika returns from process_data_events early)."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.2)  # and let anything extra arrive


def declare(ch: BlockingChannel, name: str, **arguments: object) -> str:
    return str(ch.queue_declare(name, arguments=arguments or None).method.queue)


def test_cc_and_bcc_headers_add_routing_keys_and_bcc_is_removed(
    conn: BlockingConnection,
) -> None:
    ch = conn.channel()
    ch.exchange_declare("cc-x", "direct")
    for key in ("main", "copy", "blind", "other"):
        declare(ch, f"cc-{key}")
        ch.queue_bind(f"cc-{key}", "cc-x", key)
    headers = {"CC": ["copy"], "BCC": ["blind"], "note": "kept"}
    ch.basic_publish("cc-x", "main", b"memo", pika.BasicProperties(headers=headers))
    for key in ("main", "copy", "blind"):
        method, props, body = ch.basic_get(f"cc-{key}", auto_ack=True)
        assert body == b"memo", key
        assert method.routing_key == "main"  # the original key, whichever key routed it
        assert props.headers == {"CC": ["copy"], "note": "kept"}  # BCC is never delivered
    assert ch.basic_get("cc-other", auto_ack=True)[0] is None
    # A queue matched by several keys gets the message once.
    ch.queue_bind("cc-main", "cc-x", "copy")
    ch.basic_publish("cc-x", "main", b"once", pika.BasicProperties(headers={"CC": ["copy"]}))
    assert ch.basic_get("cc-main", auto_ack=True)[2] == b"once"
    assert ch.basic_get("cc-main", auto_ack=True)[0] is None


def test_highest_priority_consumer_with_credit_gets_the_messages(
    conn: BlockingConnection,
) -> None:
    ch = conn.channel()
    queue = declare(ch, "prio-q")
    got: dict[str, list[bytes]] = {"low": [], "high": []}
    for name, priority in (("low", 1), ("high", 10)):
        consumer_ch = conn.channel()
        consumer_ch.basic_qos(prefetch_count=3)
        consumer_ch.basic_consume(
            queue,
            lambda _c, _m, _p, body, name=name: got[name].append(body),
            arguments={"x-priority": priority},
        )
    for i in range(5):
        ch.basic_publish("", queue, b"%d" % i)
    pump(conn, lambda: len(got["high"]) + len(got["low"]) == 5)
    # The high-priority consumer fills its prefetch (3, never acked); the rest spill over.
    assert got["high"] == [b"0", b"1", b"2"]
    assert got["low"] == [b"3", b"4"]


def test_single_active_consumer_fails_over_in_registration_order(
    conn: BlockingConnection,
) -> None:
    ch = conn.channel()
    queue = declare(ch, "sac-q", **{"x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    channels = {}
    for name in ("first", "second"):
        consumer_ch = conn.channel()
        consumer_ch.basic_qos(prefetch_count=10)

        def on_message(c: BlockingChannel, m: Any, _p: Any, body: bytes, name: str = name) -> None:
            got[name].append(body)
            c.basic_ack(m.delivery_tag)

        consumer_ch.basic_consume(queue, on_message, consumer_tag=name)
        channels[name] = consumer_ch
    for i in range(4):
        ch.basic_publish("", queue, b"a%d" % i)
    pump(conn, lambda: len(got["first"]) + len(got["second"]) == 4)
    assert got == {"first": [b"a0", b"a1", b"a2", b"a3"], "second": []}
    channels["first"].basic_cancel("first")
    for i in range(3):
        ch.basic_publish("", queue, b"b%d" % i)
    pump(conn, lambda: len(got["second"]) == 3)
    assert got["second"] == [b"b0", b"b1", b"b2"]
    assert len(got["first"]) == 4
