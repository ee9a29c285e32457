"""Which consumer gets which message, as RabbitMQ decides it: round robin among consumers of one
priority (a consumer served, or given prefetch credit back after it was passed over for want
of it, goes to the back; one that joins starts at the back; a cancelled one leaves its place),
the highest ``x-priority`` first, a channel's shared prefetch (``basic.qos`` global) passing
over all its consumers at once.

Each scenario runs on one channel (consumers, publishes and acks), so that RabbitMQ's answer is
deterministic too: its channel process hands the queue each publish and ack in order. The
expected orders are RabbitMQ 3.10's, recorded from the loopback oracle; the oracle test checks
that they still are (it skips where ``rabbitmq-server`` is not installed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(120)

Delivery = tuple[str, str]  # (consumer tag, body)


@dataclass
class Session:
    """One connection, one channel, an exclusive queue; the deliveries in arrival order."""

    connection: BlockingConnection
    channel: BlockingChannel
    queue: str
    got: list[Delivery] = field(default_factory=list)
    tags: dict[str, list[int]] = field(default_factory=dict)  # unacked, by consumer

    def consume(self, name: str, prefetch: int | None, priority: int | None = None) -> None:
        if prefetch is not None:
            self.channel.basic_qos(prefetch_count=prefetch)
        arguments = {"x-priority": priority} if priority is not None else None

        def on_message(_c: BlockingChannel, method: object, _p: object, body: bytes) -> None:
            self.got.append((name, body.decode()))
            self.tags.setdefault(name, []).append(method.delivery_tag)  # type: ignore[attr-defined]

        self.channel.basic_consume(self.queue, on_message, consumer_tag=name, arguments=arguments)

    def publish(self, *bodies: str, expect: int) -> None:
        """Publish ``bodies``; wait for ``expect`` more deliveries (messages may wait)."""
        for body in bodies:
            self.channel.basic_publish("", self.queue, body.encode())
        self.wait(expect)

    def ack(self, name: str, *, expect: int = 0) -> None:
        """Ack ``name``'s oldest unacked delivery; wait for ``expect`` deliveries it frees."""
        self.channel.basic_ack(self.tags[name].pop(0))
        self.wait(expect)

    def wait(self, expect: int) -> None:
        want = len(self.got) + expect
        deadline = time.monotonic() + 10
        while len(self.got) < want and time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.05)
        assert len(self.got) == want, (self.got, want)


def credit_back_keeps_the_place(s: Session) -> None:
    # Acked while still in the rotation: no one moves (C acked first is not served first).
    for name in "ABC":
        s.consume(name, 1)
    s.publish("m1", "m2", "m3", expect=3)
    s.ack("C")
    s.ack("A")
    s.publish("m4", "m5", expect=2)


def passed_over_goes_to_the_back(s: Session) -> None:
    # B is passed over (no credit) for m3; given credit back it goes behind A.
    for name in "AB":
        s.consume(name, 1)
    s.publish("m1", "m2", "m3", "m4", expect=2)
    s.ack("B", expect=1)
    s.ack("A", expect=1)


def cancel_leaves_its_place(s: Session) -> None:
    for name in "ABC":
        s.consume(name, 10)
    s.publish("m1", "m2", expect=2)
    s.channel.basic_cancel("B")
    s.publish("m3", "m4", expect=2)


def join_starts_at_the_back(s: Session) -> None:
    for name in "AB":
        s.consume(name, 10)
    s.publish("m1", expect=1)
    s.consume("C", 10)
    s.publish("m2", "m3", "m4", expect=3)


def priorities_then_round_robin(s: Session) -> None:
    s.consume("L1", 1, priority=1)
    s.consume("H1", 1, priority=10)
    s.consume("H2", 2, priority=10)
    s.consume("L2", 5, priority=1)
    s.publish(*(f"m{i}" for i in range(6)), expect=6)
    s.ack("H1")
    s.publish("x1", "x2", expect=2)
    s.ack("L1")
    s.ack("H2")
    s.publish("y1", "y2", expect=2)


def shared_prefetch_blocks_the_channel(s: Session) -> None:
    s.channel.basic_qos(prefetch_count=2, global_qos=True)
    for name in "ABC":
        s.consume(name, None)
    s.publish(*(f"m{i}" for i in range(6)), expect=2)
    s.ack("A", expect=1)
    s.ack("B", expect=1)
    s.ack("C", expect=1)
    s.ack("A", expect=1)


SCENARIOS: dict[str, tuple[Callable[[Session], None], list[Delivery]]] = {
    "credit back keeps the place": (
        credit_back_keeps_the_place,
        [("A", "m1"), ("B", "m2"), ("C", "m3"), ("A", "m4"), ("C", "m5")],
    ),
    "passed over goes to the back": (
        passed_over_goes_to_the_back,
        [("A", "m1"), ("B", "m2"), ("B", "m3"), ("A", "m4")],
    ),
    "cancel leaves its place": (
        cancel_leaves_its_place,
        [("A", "m1"), ("B", "m2"), ("C", "m3"), ("A", "m4")],
    ),
    "join starts at the back": (
        join_starts_at_the_back,
        [("A", "m1"), ("B", "m2"), ("A", "m3"), ("C", "m4")],
    ),
    "priorities then round robin": (
        priorities_then_round_robin,
        [
            *[("H1", "m0"), ("H2", "m1"), ("H2", "m2"), ("L1", "m3"), ("L2", "m4"), ("L2", "m5")],
            *[("H1", "x1"), ("L2", "x2"), ("H2", "y1"), ("L2", "y2")],
        ],
    ),
    "shared prefetch blocks the channel": (
        shared_prefetch_blocks_the_channel,
        [("A", "m0"), ("B", "m1"), ("C", "m2"), ("A", "m3"), ("B", "m4"), ("C", "m5")],
    ),
}


def _run(port: int, scenario: Callable[[Session], None]) -> list[Delivery]:
    parameters = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")
    )
    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        session = Session(connection, channel, queue)
        scenario(session)
        return session.got
    finally:
        connection.close()


@pytest.mark.parametrize("name", SCENARIOS)
def test_consumers_get_messages_in_rabbitmqs_order(
    tqbroker_thread: RunningBroker, name: str
) -> None:
    scenario, expected = SCENARIOS[name]
    assert _run(tqbroker_thread.port, scenario) == expected


def test_the_orders_are_rabbitmqs(rabbitmq_oracle: RabbitMQ) -> None:
    for scenario, expected in SCENARIOS.values():
        assert _run(rabbitmq_oracle.port, scenario) == expected
