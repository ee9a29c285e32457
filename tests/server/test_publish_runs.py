"""Publishes in runs: the publishes of one read that repeat a method frame reach the channel as
one event (``FastPath``), which checks, routes and appends them together (``route_run``,
``Queue.publish_run``). A run must answer exactly as the same publishes one by one: confirms in
order, a refusal in its middle for that publish alone (the ones before it kept), a return for
each unroutable mandatory one, and a stream appending all of it. Each run here is sent in one
write, so the broker reads it whole."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.support.rawamqp import RawAMQP, body_frame, content_header
from tqbroker.backends.log.stream import LogStream
from tqbroker.model import Message
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.frames import encode_method
from tqbroker.protocol.methods import (
    BasicAck,
    BasicConsume,
    BasicConsumeOk,
    BasicDeliver,
    BasicGet,
    BasicGetOk,
    BasicNack,
    BasicProperties,
    BasicPublish,
    BasicQos,
    BasicQosOk,
    BasicReturn,
    ConfirmSelect,
    ConfirmSelectOk,
    ExchangeDeclare,
    ExchangeDeclareOk,
    QueueBind,
    QueueBindOk,
    QueueDeclare,
    QueueDeclareOk,
)
from tqbroker.testing import RunningBroker


def run_of(
    exchange: str,
    routing_key: str,
    bodies: list[bytes],
    *,
    properties: list[BasicProperties] | None = None,
    mandatory: bool = False,
) -> bytes:
    """The bytes of one publish per body on channel 1, all with the same method frame."""
    out = b""
    for n, body in enumerate(bodies):
        props = (properties[n] if properties else BasicProperties()).encode()
        out += encode_method(1, BasicPublish(0, exchange, routing_key, mandatory))
        out += content_header(1, len(body), props) + body_frame(1, body)
    return out


@pytest.fixture
def amqp(tqbroker_thread: RunningBroker) -> Iterator[RawAMQP]:
    with RawAMQP(tqbroker_thread.host, tqbroker_thread.port) as client:
        client.handshake()
        client.open_channel(1)
        yield client


def confirm_mode(amqp: RawAMQP) -> None:
    amqp.call(1, ConfirmSelect(), ConfirmSelectOk)


def settlements(amqp: RawAMQP, count: int, settled: dict[int, str] | None = None) -> dict[int, str]:
    """How each of the first ``count`` publishes was settled, ``ack`` or ``nack``: read on
    until each is (``settled``: what earlier calls read)."""
    settled = {} if settled is None else settled
    while len(settled) < count:
        method = amqp.next_frame().method
        assert isinstance(method, BasicAck | BasicNack), method
        kind = "ack" if isinstance(method, BasicAck) else "nack"
        low = 1 if method.multiple else method.delivery_tag
        for tag in range(low, method.delivery_tag + 1):
            settled.setdefault(tag, kind)
    return settled


def declare(amqp: RawAMQP, arguments: FieldTable | None = None) -> str:
    name = f"runs-{uuid.uuid4().hex[:8]}"
    amqp.call(1, QueueDeclare(queue=name, durable=True, arguments=arguments or {}), QueueDeclareOk)
    return name


def queued(amqp: RawAMQP, queue: str) -> list[bytes]:
    """Every message in ``queue``, in order (``basic.get``, no ack)."""
    bodies: list[bytes] = []
    while True:
        amqp.send_method(1, BasicGet(queue=queue, no_ack=True))
        frame = amqp.next_frame()
        if not isinstance(frame.method, BasicGetOk):
            return bodies
        bodies.append(amqp.expect_content(1)[1])


def test_a_run_into_a_queue_that_fills_is_acked_then_nacked(amqp: RawAMQP) -> None:
    queue = declare(amqp, {"x-max-length": 5, "x-overflow": "reject-publish"})
    confirm_mode(amqp)
    amqp.send(run_of("", queue, [b"m%d" % n for n in range(8)]))
    assert settlements(amqp, 8) == {n: "ack" if n <= 5 else "nack" for n in range(1, 9)}
    assert queued(amqp, queue) == [b"m%d" % n for n in range(5)]


def test_a_run_past_a_full_queue_dead_letters_each_refused_publish_once(amqp: RawAMQP) -> None:
    dead = declare(amqp)
    queue = declare(
        amqp,
        {
            "x-max-length": 2,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
        },
    )
    confirm_mode(amqp)
    amqp.send(run_of("", queue, [b"m%d" % n for n in range(6)]))
    assert settlements(amqp, 6) == {n: "ack" if n <= 2 else "nack" for n in range(1, 7)}
    assert queued(amqp, queue) == [b"m0", b"m1"]
    assert queued(amqp, dead) == [b"m2", b"m3", b"m4", b"m5"]


def test_a_refusal_in_a_run_keeps_the_publishes_before_it(
    amqp: RawAMQP, tqbroker_thread: RunningBroker
) -> None:
    queue = declare(amqp)
    bad = BasicProperties(expiration="soon")  # not a number: 406 on the channel
    properties = [BasicProperties()] * 3 + [bad] + [BasicProperties()] * 3
    amqp.send(run_of("", queue, [b"m%d" % n for n in range(7)], properties=properties))
    close = amqp.expect_channel_close(1, 406, class_id=60, method_id=40)
    assert "invalid expiration 'soon'" in close.reply_text
    with RawAMQP(tqbroker_thread.host, tqbroker_thread.port) as other:
        other.handshake()
        other.open_channel(1)
        assert queued(other, queue) == [b"m0", b"m1", b"m2"]


def test_every_unroutable_mandatory_publish_of_a_run_is_returned(amqp: RawAMQP) -> None:
    confirm_mode(amqp)
    bodies = [b"r%d" % n for n in range(5)]
    amqp.send(run_of("amq.direct", "nowhere", bodies, mandatory=True))
    returned = []
    for _ in bodies:
        method = amqp.expect_method(BasicReturn, channel=1)
        assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
        returned.append(amqp.expect_content(1)[1])
    assert returned == bodies
    assert settlements(amqp, 5) == dict.fromkeys(range(1, 6), "ack")


def test_a_run_longer_than_one_event_into_a_stream_is_appended_in_order(amqp: RawAMQP) -> None:
    queue = declare(amqp, {"x-queue-type": "stream"})
    confirm_mode(amqp)
    count = 700  # runs end at 256 publishes: three events
    bodies = [b"s%04d" % n for n in range(count)]
    mixed = [BasicProperties(content_type="a" if n % 300 < 290 else "b") for n in range(count)]
    amqp.send(run_of("", queue, bodies, properties=mixed))
    assert settlements(amqp, count) == dict.fromkeys(range(1, count + 1), "ack")
    amqp.call(1, BasicQos(prefetch_count=count), BasicQosOk)
    amqp.send_method(1, BasicConsume(queue=queue, arguments={"x-stream-offset": "first"}))
    amqp.expect_method(BasicConsumeOk, channel=1)
    got = []
    for _ in range(count):
        amqp.expect_method(BasicDeliver, channel=1)
        properties, body = amqp.expect_content(1)
        got.append((properties, body))
    assert [body for _, body in got] == bodies
    assert [BasicProperties.decode(memoryview(p)).content_type for p, _ in got] == [
        p.content_type for p in mixed
    ]


def one_by_one_and_as_a_run(
    broker: RunningBroker, declare_route: Callable[[RawAMQP], tuple[str, list[str]]]
) -> list[tuple[dict[int, str], list[list[bytes]]]]:
    """Publish four messages to the exchange ``declare_route`` makes (on a fresh connection
    each time), one by one (each confirm awaited) and then as a run in one write: how each
    was settled and what each of its queues holds, both times."""
    outcomes = []
    for together in (False, True):
        with RawAMQP(broker.host, broker.port) as amqp:
            amqp.handshake()
            amqp.open_channel(1)
            exchange, queues = declare_route(amqp)
            confirm_mode(amqp)
            bodies = [b"M%d" % n for n in range(4)]
            settled: dict[int, str] = {}
            if together:
                amqp.send(run_of(exchange, "", bodies))
                settlements(amqp, len(bodies), settled)
            else:
                for n, body in enumerate(bodies, 1):
                    amqp.send(run_of(exchange, "", [body]))
                    settlements(amqp, n, settled)
            outcomes.append((settled, [queued(amqp, queue) for queue in queues]))
    return outcomes


def _fanout(amqp: RawAMQP, *queues: str) -> str:
    exchange = f"runs-x-{uuid.uuid4().hex[:8]}"
    amqp.call(1, ExchangeDeclare(exchange=exchange, type="fanout"), ExchangeDeclareOk)
    for queue in queues:
        amqp.call(1, QueueBind(queue=queue, exchange=exchange), QueueBindOk)
    return exchange


def test_a_run_to_queues_that_dead_letter_into_each_other_goes_as_one_by_one(
    tqbroker_thread: RunningBroker,
) -> None:
    """Each message reaches every queue of the route before the next when a queue may
    dead-letter (here into the other, past one message): the second queue sees the first's
    dead letters in the same order, and the confirms say the same."""

    def route(amqp: RawAMQP) -> tuple[str, list[str]]:
        second = declare(amqp, {"x-max-length": 3, "x-overflow": "reject-publish"})
        first = declare(
            amqp,
            {
                "x-max-length": 1,
                "x-overflow": "drop-head",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": second,
            },
        )
        return _fanout(amqp, first, second), [first, second]

    one_by_one, as_a_run = one_by_one_and_as_a_run(tqbroker_thread, route)
    assert one_by_one == as_a_run
    assert one_by_one[0] == {1: "ack", 2: "ack", 3: "nack", 4: "nack"}


def test_a_run_to_queues_that_refuse_apart_is_confirmed_as_one_by_one(
    tqbroker_thread: RunningBroker,
) -> None:
    """Two queues take a run each (neither dead-letters); the one that fills refuses the
    last two, so those are nacked although the other queue kept them."""

    def route(amqp: RawAMQP) -> tuple[str, list[str]]:
        roomy = declare(amqp)
        small = declare(amqp, {"x-max-length": 2, "x-overflow": "reject-publish"})
        return _fanout(amqp, roomy, small), [roomy, small]

    one_by_one, as_a_run = one_by_one_and_as_a_run(tqbroker_thread, route)
    assert one_by_one == as_a_run
    assert one_by_one == (
        {1: "ack", 2: "ack", 3: "nack", 4: "nack"},
        [[b"M0", b"M1", b"M2", b"M3"], [b"M0", b"M1"]],
    )


def test_a_return_precedes_what_the_next_publish_of_the_run_delivers(amqp: RawAMQP) -> None:
    queue = declare(amqp)
    exchange = f"runs-h-{uuid.uuid4().hex[:8]}"
    amqp.call(1, ExchangeDeclare(exchange=exchange, type="headers"), ExchangeDeclareOk)
    amqp.call(
        1,
        QueueBind(queue=queue, exchange=exchange, arguments={"k": "yes", "x-match": "all"}),
        QueueBindOk,
    )
    amqp.send_method(1, BasicConsume(queue=queue, no_ack=True))
    amqp.expect_method(BasicConsumeOk, channel=1)
    no, yes = BasicProperties(headers={"k": "no"}), BasicProperties(headers={"k": "yes"})
    amqp.send(run_of(exchange, "", [b"M1", b"M2"], properties=[no, yes], mandatory=True))
    assert isinstance(amqp.next_frame().method, BasicReturn)
    assert amqp.expect_content(1)[1] == b"M1"
    assert isinstance(amqp.next_frame().method, BasicDeliver)
    assert amqp.expect_content(1)[1] == b"M2"


def test_a_bug_in_a_stream_store_during_a_run_fails_the_queue_not_the_connection(
    amqp: RawAMQP, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store raises (not an ``OSError``) for a run holding a poisoned message: the queue
    fails and the publishes it could not take are nacked, as ``enqueue`` does for one; the
    connection goes on."""
    append_many = LogStream.append_many

    def buggy(self: LogStream, messages: list[Message]) -> tuple[int, OSError | None]:
        if any(message.body == b"bad" for message in messages):
            raise RuntimeError("a bug in the store")
        return append_many(self, messages)

    monkeypatch.setattr(LogStream, "append_many", buggy)
    stream = declare(amqp, {"x-queue-type": "stream"})
    other = declare(amqp)
    confirm_mode(amqp)
    amqp.send(run_of("", stream, [b"ok0", b"ok1", b"bad", b"ok3"]))
    settled = settlements(amqp, 4)
    assert settled[1] == "ack"  # routed alone, before the run's rest
    assert [settled[n] for n in (2, 3, 4)] == ["nack"] * 3  # the run the store refused
    amqp.send(run_of("", other, [b"after"]))
    assert settlements(amqp, 5, settled)[5] == "ack"
    assert queued(amqp, other) == [b"after"]
