"""Settlement and dead-lettering details a client relies on, over pika and real sockets: one
``x-death`` entry per (queue, reason), and a requeue (``basic.nack``/``basic.reject`` with
requeue) giving the consumer its prefetch credit back, on classic queues (both backends) and
streams."""

from __future__ import annotations

from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(60)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def get_one(ch: BlockingChannel, queue: str) -> tuple[int, pika.BasicProperties, bytes]:
    """The next message of ``queue`` by basic.get (waiting a little for it to arrive)."""

    def next_message() -> tuple[int, pika.BasicProperties, bytes] | None:
        method, properties, body = ch.basic_get(queue)
        return None if method is None else (method.delivery_tag, properties, body)

    return eventually(next_message, 5, what=f"a message in {queue!r}")


def deaths(properties: pika.BasicProperties) -> list[tuple[str, str, int]]:
    return [(d["queue"], d["reason"], d["count"]) for d in properties.headers["x-death"]]


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_x_death_has_one_entry_per_queue_and_reason(
    channel: BlockingChannel, durable: bool
) -> None:
    """A message dead-lettered from the same queue for two reasons (maxlen, then rejected) has
    an entry for each; a repeated (queue, reason) counts in its entry, moved to the front."""
    to_parking = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "parking"}
    channel.queue_declare("work", durable=durable, arguments={"x-max-length": 1, **to_parking})
    channel.queue_declare(
        "parking",
        durable=durable,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"},
    )
    properties = PERSISTENT if durable else None
    channel.basic_publish("", "work", b"m1", properties)
    channel.basic_publish("", "work", b"m2", properties)  # drops m1 from the head: maxlen
    tag, _props, body = get_one(channel, "work")
    assert body == b"m2"
    channel.basic_ack(tag)

    tag, props, body = get_one(channel, "parking")
    assert body == b"m1"
    assert deaths(props) == [("work", "maxlen", 1)]
    channel.basic_reject(tag, requeue=False)  # parking -> work (a rejection: no cycle)

    tag, props, body = get_one(channel, "work")
    assert deaths(props) == [("parking", "rejected", 1), ("work", "maxlen", 1)]
    channel.basic_reject(tag, requeue=False)  # work again, for another reason

    tag, props, body = get_one(channel, "parking")
    assert deaths(props) == [
        ("work", "rejected", 1),
        ("parking", "rejected", 1),
        ("work", "maxlen", 1),
    ]
    headers: dict[str, Any] = props.headers
    assert headers["x-first-death-reason"] == "maxlen"
    assert headers["x-last-death-reason"] == "rejected"
    assert headers["x-last-death-queue"] == "work"
    channel.basic_reject(tag, requeue=False)  # parking/rejected again: counted, to the front

    tag, props, body = get_one(channel, "work")
    assert deaths(props) == [
        ("parking", "rejected", 2),
        ("work", "rejected", 1),
        ("work", "maxlen", 1),
    ]
    channel.basic_ack(tag)


def consume_settling(
    ch: BlockingChannel, queue: str, settle: list[str], arguments: dict[str, Any] | None = None
) -> list[tuple[bytes, bool]]:
    """Consume with prefetch 1, settling the n-th delivery as ``settle[n]`` says ("nack",
    "reject": both with requeue; "drop": reject without requeue; "ack"); the (body,
    redelivered) of each delivery."""
    ch.basic_qos(prefetch_count=1)
    got: list[tuple[bytes, bool]] = []
    for method, _properties, body in ch.consume(
        queue, arguments=arguments, consumer_tag="settler", inactivity_timeout=3
    ):
        assert method is not None, f"delivery {len(got) + 1} never came: {got}"
        got.append((body, method.redelivered))
        action = settle[len(got) - 1]
        if action == "nack":
            ch.basic_nack(method.delivery_tag, requeue=True)
        elif action == "reject":
            ch.basic_reject(method.delivery_tag, requeue=True)
        elif action == "drop":
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)
        if len(got) == len(settle):
            break
    ch.cancel()
    return got


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_a_requeue_gives_the_prefetch_credit_back(channel: BlockingChannel, durable: bool) -> None:
    """With prefetch 1 the consumer gets the next delivery only once it settled the last:
    a nack or reject with requeue settles it (the message comes again, redelivered)."""
    channel.queue_declare("credit", durable=durable)
    for body in (b"a", b"b"):
        channel.basic_publish("", "credit", body, PERSISTENT if durable else None)
    got = consume_settling(channel, "credit", ["nack", "reject", "ack", "nack", "ack"])
    assert got == [(b"a", False), (b"a", True), (b"a", True), (b"b", False), (b"b", True)]


def test_a_reject_without_requeue_gives_the_prefetch_credit_back(channel: BlockingChannel) -> None:
    """A message rejected for good (dropped or dead-lettered) settles its delivery: with
    prefetch 1 the next message comes."""
    channel.queue_declare("drop-credit")
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", "drop-credit", body)
    got = consume_settling(channel, "drop-credit", ["drop", "drop", "ack"])
    assert got == [(b"a", False), (b"b", False), (b"c", False)]


def test_a_stream_nack_gives_the_prefetch_credit_back(channel: BlockingChannel) -> None:
    """A stream never takes a message back: a nack or reject with requeue only returns the
    credit, and the consumer goes on with the next offset."""
    channel.queue_declare("s-credit", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", "s-credit", body, PERSISTENT)
    got = consume_settling(
        channel, "s-credit", ["nack", "reject", "ack"], arguments={"x-stream-offset": "first"}
    )
    assert [body for body, _ in got] == [b"a", b"b", b"c"]


def test_a_dead_letter_routing_key_drops_the_cc_header(channel: BlockingChannel) -> None:
    """With ``x-dead-letter-routing-key`` the copy is routed by that key alone: the ``CC``
    keys the message was published with are dropped (as RabbitMQ does)."""
    channel.exchange_declare("dlx", "direct")
    channel.queue_declare(
        "src", arguments={"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"}
    )
    for queue, key in (("dead", "dead"), ("cc-target", "cc-key")):
        channel.queue_declare(queue)
        channel.queue_bind(queue, "dlx", key)
    channel.basic_publish("", "src", b"x", pika.BasicProperties(headers={"CC": ["cc-key"]}))
    tag, _props, _body = get_one(channel, "src")
    channel.basic_reject(tag, requeue=False)
    _tag, props, body = get_one(channel, "dead")
    assert body == b"x"
    assert "CC" not in props.headers
    assert channel.queue_declare("cc-target", passive=True).method.message_count == 0
