"""tqbroker answers every error path of ``reply_cases`` with RabbitMQ's reply code and reply text,
word for word, and advertises the capabilities RabbitMQ does: compared against
``rabbitmq_replies.json``, captured from RabbitMQ 3.10.8 (``test_reply_texts_oracle.py``
captures it again and diffs, so the table cannot drift from the real broker).

Real pika and raw-socket clients against a broker on loopback; one broker for the module (each
case uses fixed names and deletes what it declared).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tqbroker.testing import RunningBroker, running_broker

from .reply_cases import CASES, capabilities, load_table

TABLE = load_table()

# Where tqbroker answers otherwise on purpose: case -> (tqbroker's answer, why).
DIFFERENT_BY_DESIGN: dict[str, tuple[list[Any], str]] = {
    "unknown_method": (
        [503, "COMMAND_INVALID - unknown method 50.99"],
        "RabbitMQ drops the socket without a word; tqbroker says what it did not understand",
    ),
    "frame_too_large": (
        [501, "FRAME_ERROR - frame size 200017 exceeds the negotiated frame_max 131072"],
        "RabbitMQ's limit is frame_max - 8 (payload); tqbroker's framing compares the payload"
        " with frame_max itself, so the number would be wrong in RabbitMQ's words",
    ),
    "arg_delivery_limit_string": (
        [
            406,
            "PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue"
            " 'c.arg.delivery_limit_string' in vhost '/': \"expected integer, got longstr\"",
        ],
        "classic queues take x-delivery-limit in tqbroker (RabbitMQ 3.10: quorum only)",
    ),
    "stream_offset_bad": (
        [
            406,
            "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for consumer on stream queue"
            " 'c.st3' in vhost '/': first, last, next, an offset, a timestamp or an interval"
            " such as 1h (got 'bogus')",
        ],
        "RabbitMQ 3.10 crashes the channel (541 INTERNAL_ERROR); tqbroker says what it takes",
    ),
    "stream_segment_size_small": (
        [
            406,
            "PRECONDITION_FAILED - invalid arg 'x-stream-max-segment-size-bytes' for queue"
            " 'c.st8' in vhost '/': \"must be >= 1048576\"",
        ],
        "segments under 1 MiB would let a client exhaust file descriptors (3 files each)",
    ),
    "channel_number_above_channel_max": (
        [
            530,
            "NOT_ALLOWED - number of channels opened (2048) has reached the negotiated"
            " channel_max (2047)",
        ],
        "the spec's channel-max is the highest channel number; RabbitMQ 3.10 counts open"
        " channels instead and opens channel 2048",
    ),
}


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def test_the_table_covers_every_case() -> None:
    assert set(TABLE["replies"]) == set(CASES)
    assert set(DIFFERENT_BY_DESIGN) <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reply_matches_rabbitmq(broker: RunningBroker, name: str) -> None:
    got = CASES[name](broker.host, broker.port)
    if name in DIFFERENT_BY_DESIGN:
        expected, why = DIFFERENT_BY_DESIGN[name]
        assert TABLE["replies"][name] != expected, f"{name} matches RabbitMQ now: {why}"
        assert got == expected
    else:
        assert got == TABLE["replies"][name]


def test_capabilities_match_rabbitmq(broker: RunningBroker) -> None:
    """Every capability RabbitMQ 3.10 advertises, tqbroker implements and advertises:
    connection.blocked (resource alarms), consumer_priorities (x-priority), direct_reply_to
    (amq.rabbitmq.reply-to) among them."""
    got = capabilities(broker.host, broker.port)
    assert got == TABLE["capabilities"]
    for name in ("connection.blocked", "consumer_priorities", "direct_reply_to"):
        assert got[name] is True


def test_consumer_priorities_are_what_the_capability_says(broker: RunningBroker) -> None:
    """The capability is honest: the higher x-priority consumer gets the messages while it
    has room."""
    params = pika.ConnectionParameters(broker.host, broker.port)
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.queue_declare("c.prio-order", exclusive=True)
        got: list[str] = []
        ch.basic_consume("c.prio-order", lambda *_: got.append("low"), auto_ack=True)
        ch.basic_consume(
            "c.prio-order",
            lambda *_: got.append("high"),
            auto_ack=True,
            arguments={"x-priority": 10},
        )
        for _ in range(5):
            ch.basic_publish("", "c.prio-order", b"x")
        while len(got) < 5:
            conn.process_data_events(1)
        assert got == ["high"] * 5
