"""pika BlockingConnection against the broker: the scenarios RabbitMQ users run every day.

Every test talks to a broker in a background thread (``tqbroker_thread``) through unmodified
pika, and asserts what a RabbitMQ user would see: bodies, order, counts, redelivered flags and
reply codes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.spec import Basic, BasicProperties

from tests.support.pikaqueue import drain
from tests.support.polling import eventually
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(30)

Connect = Callable[[], BlockingConnection]


@pytest.fixture
def connect(tqbroker_thread: RunningBroker) -> Iterator[Connect]:
    """Open any number of connections; all are closed at the end of the test."""
    opened: list[BlockingConnection] = []

    def _connect() -> BlockingConnection:
        params = pika.URLParameters(tqbroker_thread.url)
        params.socket_timeout = 5
        params.blocked_connection_timeout = 5
        conn = pika.BlockingConnection(params)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        if conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                conn.close()


@pytest.fixture
def channel(connect: Connect) -> BlockingChannel:
    return connect().channel()


def pump(*conns: BlockingConnection, until: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Process I/O on every connection until ``until()`` holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            return False
        for conn in conns:
            conn.process_data_events(time_limit=0.01)
    return True


def pump_for(*conns: BlockingConnection, seconds: float) -> None:
    """Process I/O for a fixed time (to show that something does *not* arrive)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for conn in conns:
            conn.process_data_events(time_limit=0.01)


def message_count(channel: BlockingChannel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def anon_queue(channel: BlockingChannel) -> str:
    return channel.queue_declare("", exclusive=True).method.queue


# -- work queues ---------------------------------------------------------------------------------


def test_work_queue_two_competing_consumers_each_message_once(connect: Connect) -> None:
    producer = connect().channel()
    producer.queue_declare("tasks", durable=True)

    workers = [connect(), connect()]
    received: dict[int, list[bytes]] = {0: [], 1: []}
    redelivered: list[bool] = []

    for index, conn in enumerate(workers):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)

        def on_message(
            ch: BlockingChannel,
            method: Basic.Deliver,
            _props: BasicProperties,
            body: bytes,
            index: int = index,
        ) -> None:
            received[index].append(body)
            redelivered.append(method.redelivered)
            ch.basic_ack(method.delivery_tag)

        ch.basic_consume("tasks", on_message)

    sent = [f"task {i}".encode() for i in range(40)]
    for body in sent:
        producer.basic_publish(
            "", "tasks", body, pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        )

    assert pump(*workers, until=lambda: len(received[0]) + len(received[1]) >= len(sent))
    pump_for(*workers, seconds=0.2)  # nothing more (no duplicates) may arrive

    everything = received[0] + received[1]
    assert sorted(everything) == sorted(sent)
    assert len(everything) == len(set(everything)) == len(sent)
    assert received[0], "worker 0 got no work"
    assert received[1], "worker 1 got no work"
    # Round-robin with prefetch 1: neither worker is starved.
    assert min(len(received[0]), len(received[1])) >= len(sent) // 4
    # Each worker sees its share in publish order.
    for bodies in received.values():
        assert bodies == sorted(bodies, key=sent.index)
    assert not any(redelivered)
    assert message_count(producer, "tasks") == 0


# -- exchanges -----------------------------------------------------------------------------------


def test_fanout_publish_subscribe(channel: BlockingChannel) -> None:
    channel.exchange_declare("logs", exchange_type="fanout")
    queues = [anon_queue(channel) for _ in range(3)]
    for queue in queues:
        channel.queue_bind(queue, "logs")
    unbound = anon_queue(channel)

    for i in range(5):
        channel.basic_publish("logs", "ignored-key", f"log {i}".encode())

    expected = [f"log {i}".encode() for i in range(5)]
    for queue in queues:
        assert drain(channel, queue) == expected
    assert drain(channel, unbound) == []


def test_topic_routing_star_and_hash(channel: BlockingChannel) -> None:
    channel.exchange_declare("topic_logs", exchange_type="topic")
    q1, q2, q_all, q_az = (anon_queue(channel) for _ in range(4))
    channel.queue_bind(q1, "topic_logs", "*.orange.*")
    channel.queue_bind(q2, "topic_logs", "*.*.rabbit")
    channel.queue_bind(q2, "topic_logs", "lazy.#")
    channel.queue_bind(q_all, "topic_logs", "#")
    channel.queue_bind(q_az, "topic_logs", "a.#.z")

    keys = [
        "quick.orange.rabbit",  # q1, q2
        "lazy.orange.elephant",  # q1, q2
        "quick.orange.fox",  # q1
        "lazy.brown.fox",  # q2
        "lazy.pink.rabbit",  # q2 (matches two bindings, delivered once)
        "quick.brown.fox",  # none of q1/q2
        "orange",  # too few words for *.orange.*
        "quick.orange.male.rabbit",  # too many words
        "lazy.orange.male.rabbit",  # q2 through lazy.#
        "lazy",  # q2: # matches zero words
        "a.z",  # q_az: # matches zero words in the middle
        "a.b.c.z",  # q_az
        "a.b",  # not q_az
        "xa.z",  # not q_az
    ]
    for key in keys:
        channel.basic_publish("topic_logs", key, key.encode())

    assert drain(channel, q1) == [
        b"quick.orange.rabbit",
        b"lazy.orange.elephant",
        b"quick.orange.fox",
    ]
    assert drain(channel, q2) == [
        b"quick.orange.rabbit",
        b"lazy.orange.elephant",
        b"lazy.brown.fox",
        b"lazy.pink.rabbit",
        b"lazy.orange.male.rabbit",
        b"lazy",
    ]
    assert drain(channel, q_all) == [key.encode() for key in keys]
    assert drain(channel, q_az) == [b"a.z", b"a.b.c.z"]


def test_headers_exchange_x_match_all_and_any(channel: BlockingChannel) -> None:
    channel.exchange_declare("hdrs", exchange_type="headers")
    q_all, q_any = anon_queue(channel), anon_queue(channel)
    channel.queue_bind(
        q_all, "hdrs", arguments={"x-match": "all", "format": "pdf", "type": "report"}
    )
    channel.queue_bind(q_any, "hdrs", arguments={"x-match": "any", "format": "pdf", "type": "log"})

    cases = {
        "pdf-report": {"format": "pdf", "type": "report"},  # all, any
        "pdf-report-extra": {"format": "pdf", "type": "report", "year": 2024},  # all, any
        "pdf-only": {"format": "pdf"},  # any
        "zip-log": {"format": "zip", "type": "log"},  # any
        "zip-report": {"format": "zip", "type": "report"},  # neither
        "none": {},  # neither
    }
    for name, headers in cases.items():
        channel.basic_publish(
            "hdrs", "", name.encode(), pika.BasicProperties(headers=headers or None)
        )

    assert drain(channel, q_all) == [b"pdf-report", b"pdf-report-extra"]
    assert drain(channel, q_any) == [b"pdf-report", b"pdf-report-extra", b"pdf-only", b"zip-log"]


def test_direct_exchange_routing(channel: BlockingChannel) -> None:
    channel.exchange_declare("direct_logs", exchange_type="direct")
    q_errors, q_all = anon_queue(channel), anon_queue(channel)
    channel.queue_bind(q_errors, "direct_logs", "error")
    for severity in ("info", "warning", "error"):
        channel.queue_bind(q_all, "direct_logs", severity)
    channel.queue_bind(q_all, "direct_logs", "error")  # a duplicate binding changes nothing

    for severity in ("info", "error", "debug", "warning", "error"):
        channel.basic_publish("direct_logs", severity, severity.encode())

    assert drain(channel, q_errors) == [b"error", b"error"]
    assert drain(channel, q_all) == [b"info", b"error", b"warning", b"error"]

    channel.queue_unbind(q_all, "direct_logs", "info")
    channel.basic_publish("direct_logs", "info", b"info again")
    assert drain(channel, q_all) == []


def test_default_exchange_and_amq_direct(channel: BlockingChannel) -> None:
    queue = anon_queue(channel)
    channel.queue_bind(queue, "amq.direct", "k")
    channel.basic_publish("", queue, b"via default")
    channel.basic_publish("amq.direct", "k", b"via amq.direct")
    assert drain(channel, queue) == [b"via default", b"via amq.direct"]


def test_exchange_to_exchange_binding(channel: BlockingChannel) -> None:
    channel.exchange_declare("e2e.source", exchange_type="topic")
    channel.exchange_declare("e2e.dest", exchange_type="fanout")
    channel.exchange_bind(destination="e2e.dest", source="e2e.source", routing_key="orders.#")
    downstream = anon_queue(channel)
    channel.queue_bind(downstream, "e2e.dest")
    direct_on_source = anon_queue(channel)
    channel.queue_bind(direct_on_source, "e2e.source", "orders.created")

    channel.basic_publish("e2e.source", "orders.created", b"created")
    channel.basic_publish("e2e.source", "payments.created", b"payment")
    channel.basic_publish("e2e.source", "orders.eu.shipped", b"shipped")

    assert drain(channel, downstream) == [b"created", b"shipped"]
    assert drain(channel, direct_on_source) == [b"created"]

    channel.exchange_unbind(destination="e2e.dest", source="e2e.source", routing_key="orders.#")
    channel.basic_publish("e2e.source", "orders.cancelled", b"cancelled")
    assert drain(channel, downstream) == []


def test_alternate_exchange_catches_unroutable(channel: BlockingChannel) -> None:
    channel.exchange_declare("unrouted", exchange_type="fanout")
    channel.exchange_declare(
        "with-ae", exchange_type="direct", arguments={"alternate-exchange": "unrouted"}
    )
    routed, unrouted = anon_queue(channel), anon_queue(channel)
    channel.queue_bind(routed, "with-ae", "known")
    channel.queue_bind(unrouted, "unrouted")

    channel.confirm_delivery()
    channel.basic_publish("with-ae", "known", b"routed")
    # Reaches the alternate exchange, so it is routed: no basic.return even when mandatory.
    channel.basic_publish("with-ae", "unknown", b"to the AE", mandatory=True)

    assert drain(channel, routed) == [b"routed"]
    assert drain(channel, unrouted) == [b"to the AE"]


# -- RPC -----------------------------------------------------------------------------------------


def test_rpc_reply_to_and_correlation_id(connect: Connect) -> None:
    server_conn, client_conn = connect(), connect()
    server = server_conn.channel()
    server.queue_declare("rpc_queue")
    server.basic_qos(prefetch_count=1)

    def on_request(
        ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        n = int(body)
        ch.basic_publish(
            "",
            props.reply_to,
            str(n * n).encode(),
            pika.BasicProperties(correlation_id=props.correlation_id),
        )
        ch.basic_ack(method.delivery_tag)

    server.basic_consume("rpc_queue", on_request)

    client = client_conn.channel()
    callback_queue = anon_queue(client)
    responses: dict[str, bytes] = {}

    def on_response(
        _ch: BlockingChannel, _method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        responses[props.correlation_id] = body

    client.basic_consume(callback_queue, on_response, auto_ack=True)

    requests = {str(uuid.uuid4()): n for n in range(1, 6)}
    for corr_id, n in requests.items():
        client.basic_publish(
            "",
            "rpc_queue",
            str(n).encode(),
            pika.BasicProperties(reply_to=callback_queue, correlation_id=corr_id),
        )
    assert pump(server_conn, client_conn, until=lambda: len(responses) == len(requests))
    assert responses == {corr_id: str(n * n).encode() for corr_id, n in requests.items()}


def test_rpc_direct_reply_to(connect: Connect) -> None:
    """RabbitMQ's direct reply-to pseudo-queue ``amq.rabbitmq.reply-to``."""
    server_conn, client_conn = connect(), connect()
    server = server_conn.channel()
    server.queue_declare("rpc_direct")

    def on_request(
        ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
        ch.basic_publish(
            "",
            props.reply_to,
            body.upper(),
            pika.BasicProperties(correlation_id=props.correlation_id),
        )
        ch.basic_ack(method.delivery_tag)

    server.basic_consume("rpc_direct", on_request)

    client = client_conn.channel()
    replies: list[tuple[str, bytes]] = []
    client.basic_consume(
        "amq.rabbitmq.reply-to",
        lambda _ch, _m, props, body: replies.append((props.correlation_id, body)),
        auto_ack=True,
    )
    client.basic_publish(
        "",
        "rpc_direct",
        b"ping",
        pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c1"),
    )
    assert pump(server_conn, client_conn, until=lambda: bool(replies))
    assert replies == [("c1", b"PING")]


def test_direct_reply_to_misuse_is_406(connect: Connect) -> None:
    conn = connect()
    # Publishing with reply_to=amq.rabbitmq.reply-to needs a reply consumer on the channel.
    ch = conn.channel()
    ch.queue_declare("rpc_direct_misuse")
    ch.confirm_delivery()  # so that basic_publish waits for the broker's answer
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.basic_publish(
            "", "rpc_direct_misuse", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
        )
    assert excinfo.value.reply_code == 406
    # The reply consumer must be in no-ack mode.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().basic_consume("amq.rabbitmq.reply-to", lambda *_: None, auto_ack=False)
    assert excinfo.value.reply_code == 406
    assert conn.is_open


# -- acknowledgements and redelivery ----------------------------------------------------------


def _consume_into(
    ch: BlockingChannel, queue: str, into: list[tuple[bytes, bool, int]], auto_ack: bool = False
) -> str:
    def on_message(
        _ch: BlockingChannel, method: Basic.Deliver, _props: BasicProperties, body: bytes
    ) -> None:
        into.append((body, method.redelivered, method.delivery_tag))

    return ch.basic_consume(queue, on_message, auto_ack=auto_ack)


def test_redelivery_after_consumer_connection_closes_without_ack(connect: Connect) -> None:
    producer = connect().channel()
    producer.queue_declare("jobs")
    for i in range(3):
        producer.basic_publish("", "jobs", f"job {i}".encode())

    first_conn = connect()
    first: list[tuple[bytes, bool, int]] = []
    _consume_into(first_conn.channel(), "jobs", first)
    assert pump(first_conn, until=lambda: len(first) == 3)
    assert [(body, redelivered) for body, redelivered, _ in first] == [
        (b"job 0", False),
        (b"job 1", False),
        (b"job 2", False),
    ]

    second_conn = connect()
    second: list[tuple[bytes, bool, int]] = []
    _consume_into(second_conn.channel(), "jobs", second)
    pump_for(second_conn, seconds=0.2)
    assert second == []  # all three are still unacked on the first consumer

    first_conn.close()  # the worker goes away mid-work
    assert pump(second_conn, until=lambda: len(second) == 3)
    pump_for(second_conn, seconds=0.1)
    assert [(body, redelivered) for body, redelivered, _ in second] == [
        (b"job 0", True),
        (b"job 1", True),
        (b"job 2", True),
    ]


CRASHING_WORKER = textwrap.dedent(
    """
    import sys, pika
    conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
    ch = conn.channel()
    got = []
    def on_message(ch, method, props, body):
        got.append(body)
        if len(got) == 2:
            print("working", flush=True)
    ch.basic_consume("crashy", on_message)
    ch.start_consuming()
    """
)


def test_redelivery_after_consumer_process_is_killed(
    connect: Connect, tqbroker_thread: RunningBroker
) -> None:
    ch = connect().channel()
    ch.queue_declare("crashy")
    ch.basic_publish("", "crashy", b"one")
    ch.basic_publish("", "crashy", b"two")

    worker = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WORKER, tqbroker_thread.url],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "working"
        assert message_count(ch, "crashy") == 0  # both delivered, neither acked
        worker.kill()  # SIGKILL: no close handshake, the socket just goes away
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)

    eventually(lambda: message_count(ch, "crashy") >= 2, 5)
    results = []
    for _ in range(2):
        method, _props, body = ch.basic_get("crashy")
        assert method is not None
        results.append((body, method.redelivered))
        ch.basic_ack(method.delivery_tag)
    assert results == [(b"one", True), (b"two", True)]


def test_qos_prefetch_limits_unacked_deliveries(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    queue = anon_queue(ch)
    for i in range(10):
        ch.basic_publish("", queue, f"m{i}".encode())

    ch.basic_qos(prefetch_count=3)
    got: list[tuple[bytes, bool, int]] = []
    _consume_into(ch, queue, got)
    assert pump(conn, until=lambda: len(got) >= 3)
    pump_for(conn, seconds=0.3)
    assert [body for body, _, _ in got] == [b"m0", b"m1", b"m2"]

    ch.basic_ack(got[0][2])  # one slot frees up: exactly one more
    assert pump(conn, until=lambda: len(got) >= 4)
    pump_for(conn, seconds=0.3)
    assert [body for body, _, _ in got] == [b"m0", b"m1", b"m2", b"m3"]

    ch.basic_ack(got[3][2], multiple=True)  # acks m1..m3: three more
    assert pump(conn, until=lambda: len(got) >= 7)
    pump_for(conn, seconds=0.3)
    assert [body for body, _, _ in got] == [f"m{i}".encode() for i in range(7)]
    assert message_count(ch, queue) == 3


def test_nack_and_reject_with_and_without_requeue(channel: BlockingChannel) -> None:
    queue = anon_queue(channel)
    for body in (b"a", b"b", b"c", b"d"):
        channel.basic_publish("", queue, body)

    method, _, body = channel.basic_get(queue)
    assert (body, method.redelivered) == (b"a", False)
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = channel.basic_get(queue)
    assert (body, method.redelivered) == (b"a", True)  # back at the head, flagged
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = channel.basic_get(queue)
    assert (body, method.redelivered) == (b"a", True)
    channel.basic_reject(method.delivery_tag, requeue=False)  # dropped for good

    method, _, body = channel.basic_get(queue)
    assert body == b"b"
    method2, _, body2 = channel.basic_get(queue)
    assert body2 == b"c"
    channel.basic_nack(method2.delivery_tag, multiple=True, requeue=False)  # drops b and c

    assert message_count(channel, queue) == 1
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"d", False, 0)
    assert channel.basic_get(queue) == (None, None, None)


def test_nack_requeue_redelivers_to_consumer(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    queue = anon_queue(ch)
    ch.basic_publish("", queue, b"retry me")
    got: list[tuple[bytes, bool, int]] = []
    _consume_into(ch, queue, got)
    assert pump(conn, until=lambda: len(got) == 1)
    ch.basic_nack(got[0][2], requeue=True)
    assert pump(conn, until=lambda: len(got) == 2)
    ch.basic_ack(got[1][2])
    pump_for(conn, seconds=0.2)
    assert [(body, redelivered) for body, redelivered, _ in got] == [
        (b"retry me", False),
        (b"retry me", True),
    ]
    assert got[1][2] > got[0][2]  # a new delivery tag


def test_basic_recover_redelivers_unacked(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    queue = anon_queue(ch)
    for body in (b"x", b"y", b"z"):
        ch.basic_publish("", queue, body)
    got: list[tuple[bytes, bool, int]] = []
    _consume_into(ch, queue, got)
    assert pump(conn, until=lambda: len(got) == 3)

    ch.basic_recover(requeue=True)
    assert pump(conn, until=lambda: len(got) == 6)
    pump_for(conn, seconds=0.2)
    assert [(body, redelivered) for body, redelivered, _ in got] == [
        (b"x", False),
        (b"y", False),
        (b"z", False),
        (b"x", True),
        (b"y", True),
        (b"z", True),
    ]
    ch.basic_ack(got[-1][2], multiple=True)
    assert message_count(ch, queue) == 0


# -- publisher confirms and transactions --------------------------------------------------------


def test_publisher_confirms(channel: BlockingChannel) -> None:
    queue = anon_queue(channel)
    channel.confirm_delivery()
    for i in range(50):
        channel.basic_publish("", queue, f"c{i}".encode())  # raises if nacked
    channel.basic_publish("", queue, b"mandatory, routable", mandatory=True)
    assert message_count(channel, queue) == 51

    with pytest.raises(pika.exceptions.UnroutableError) as excinfo:
        channel.basic_publish("", "no-such-queue", b"lost", mandatory=True)
    [returned] = excinfo.value.messages
    assert returned.method.reply_code == 312
    assert returned.method.reply_text == "NO_ROUTE"
    assert returned.method.routing_key == "no-such-queue"
    assert returned.body == b"lost"

    # Not mandatory: silently dropped, still confirmed.
    channel.basic_publish("", "no-such-queue", b"dropped")
    assert channel.is_open


def test_confirm_publish_to_missing_exchange_closes_channel_404(channel: BlockingChannel) -> None:
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        channel.basic_publish("no-such-exchange", "k", b"x")
    assert excinfo.value.reply_code == 404
    assert "no-such-exchange" in excinfo.value.reply_text


def test_mandatory_returned_without_confirms(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    returned: list[tuple[int, str, bytes]] = []
    ch.add_on_return_callback(
        lambda _ch, method, _props, body: returned.append(
            (method.reply_code, method.routing_key, body)
        )
    )
    ch.basic_publish("amq.direct", "nobody", b"bounce", mandatory=True)
    assert pump(conn, until=lambda: bool(returned))
    assert returned == [(312, "nobody", b"bounce")]


def test_tx_select_commit_rollback(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    observer = conn.channel()
    queue = anon_queue(ch)

    ch.tx_select()
    ch.basic_publish("", queue, b"t1")
    ch.basic_publish("", queue, b"t2")
    assert message_count(observer, queue) == 0  # not visible before commit
    ch.tx_commit()
    assert message_count(observer, queue) == 2

    ch.basic_publish("", queue, b"t3")
    ch.tx_rollback()
    assert message_count(observer, queue) == 2
    ch.tx_commit()  # nothing pending
    assert message_count(observer, queue) == 2

    # Acks are transactional too: a rolled-back ack leaves the message unacked.
    method, _, body = ch.basic_get(queue)
    assert body == b"t1"
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    ch.close()  # the unacked t1 goes back to the queue
    assert message_count(observer, queue) == 2
    method, _, body = observer.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"t1", True)

    ch = conn.channel()
    ch.tx_select()
    method, _, body = ch.basic_get(queue)
    assert body == b"t2"
    ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    ch.close()
    assert message_count(observer, queue) == 0


def test_tx_commit_without_select_is_406(channel: BlockingChannel) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        channel.tx_commit()
    assert excinfo.value.reply_code == 406


# -- queue lifecycle and errors -----------------------------------------------------------------


def test_queue_purge_and_delete(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("purgeme")
    for i in range(4):
        ch.basic_publish("", "purgeme", str(i).encode())
    assert ch.queue_purge("purgeme").method.message_count == 4
    assert message_count(ch, "purgeme") == 0

    ch.basic_publish("", "purgeme", b"left")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_delete("purgeme", if_empty=True)
    assert excinfo.value.reply_code == 406

    ch = conn.channel()
    consumer_ch = conn.channel()
    consumer_ch.basic_consume("purgeme", lambda *_: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_delete("purgeme", if_unused=True)
    assert excinfo.value.reply_code == 406
    consumer_ch.close()  # the delivered message goes back (it was never acked)

    ch = conn.channel()
    assert message_count(ch, "purgeme") == 1
    assert ch.queue_delete("purgeme").method.message_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare("purgeme", passive=True)
    assert excinfo.value.reply_code == 404


def test_exclusive_queue_from_another_connection_is_405(connect: Connect) -> None:
    owner = connect()
    owner_ch = owner.channel()
    owner_ch.queue_declare("mine", exclusive=True)

    other = connect()
    for attempt in (
        lambda ch: ch.queue_declare("mine", exclusive=True),
        lambda ch: ch.queue_declare("mine", passive=True),
        lambda ch: ch.basic_consume("mine", lambda *_: None),
        lambda ch: ch.basic_get("mine"),
        lambda ch: ch.queue_delete("mine"),
    ):
        ch = other.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
            attempt(ch)
        assert excinfo.value.reply_code == 405

    # The owner is unaffected, and the queue dies with the owner's connection.
    owner_ch.basic_publish("", "mine", b"still mine")
    assert drain(owner_ch, "mine") == [b"still mine"]
    owner.close()
    # As in RabbitMQ, the queue goes once the broker has finished with the closed connection,
    # which may be just after close-ok: until then it is still locked (405), then gone (404).
    codes = []

    def unlocked() -> bool:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
            other.channel().queue_declare("mine", passive=True)
        codes.append(excinfo.value.reply_code)
        return codes[-1] != 405

    eventually(unlocked, 5, 0.01)
    assert codes[-1] == 404, codes
    assert set(codes) <= {404, 405}


def test_passive_declare_of_missing_queue_and_exchange_is_404(connect: Connect) -> None:
    conn = connect()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().queue_declare("does-not-exist", passive=True)
    assert excinfo.value.reply_code == 404
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().exchange_declare("does-not-exist", passive=True)
    assert excinfo.value.reply_code == 404
    assert conn.is_open  # soft errors close only the channel


def test_inequivalent_redeclare_is_406(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("q-durable", durable=True)
    ch.exchange_declare("x-topic", exchange_type="topic")
    ch.queue_declare("q-durable", durable=True)  # an equivalent redeclare is fine
    ch.exchange_declare("x-topic", exchange_type="topic")

    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().queue_declare("q-durable", durable=False)
    assert excinfo.value.reply_code == 406
    assert "durable" in excinfo.value.reply_text
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().queue_declare("q-durable", durable=True, arguments={"x-max-length": 10})
    assert excinfo.value.reply_code == 406
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().exchange_declare("x-topic", exchange_type="direct")
    assert excinfo.value.reply_code == 406
    assert conn.is_open


def test_server_named_queues(channel: BlockingChannel) -> None:
    first = channel.queue_declare("", exclusive=True)
    second = channel.queue_declare("", exclusive=True)
    names = {first.method.queue, second.method.queue}
    assert len(names) == 2
    assert all(name.startswith("amq.gen-") for name in names)
    assert first.method.message_count == 0
    assert first.method.consumer_count == 0
    channel.basic_publish("", first.method.queue, b"to a generated name")
    assert drain(channel, first.method.queue) == [b"to a generated name"]


def test_auto_delete_queue_goes_after_last_consumer_cancels(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("ephemeral", auto_delete=True)
    tag1 = ch.basic_consume("ephemeral", lambda *_: None)
    tag2 = ch.basic_consume("ephemeral", lambda *_: None)
    assert ch.queue_declare("ephemeral", passive=True).method.consumer_count == 2

    ch.basic_cancel(tag1)
    assert ch.queue_declare("ephemeral", passive=True).method.consumer_count == 1
    ch.basic_cancel(tag2)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare("ephemeral", passive=True)
    assert excinfo.value.reply_code == 404


def test_consumer_cancel_notification_when_queue_deleted(connect: Connect) -> None:
    consumer_conn = connect()
    ch = consumer_conn.channel()
    ch.queue_declare("doomed")
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume("doomed", lambda *_: None)

    connect().channel().queue_delete("doomed")
    assert pump(consumer_conn, until=lambda: bool(cancelled))
    assert cancelled == [tag]
    assert ch.is_open
    assert tag not in ch.consumer_tags


def test_basic_get_message_count(channel: BlockingChannel) -> None:
    queue = anon_queue(channel)
    for body in (b"1", b"2", b"3"):
        channel.basic_publish("", queue, body)
    seen = []
    for _ in range(3):
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        seen.append((body, method.message_count, method.exchange, method.routing_key))
    assert seen == [(b"1", 2, "", queue), (b"2", 1, "", queue), (b"3", 0, "", queue)]
    assert channel.basic_get(queue) == (None, None, None)


def test_message_properties_round_trip(channel: BlockingChannel) -> None:
    queue = anon_queue(channel)
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={
            "str": "text",
            "int": 42,
            "neg": -7,
            "big": 2**40,
            "bool": True,
            "list": [1, "two", False],
            "nested": {"a": {"b": "c"}},
            "bytes": b"raw",
        },
        delivery_mode=2,
        priority=5,
        correlation_id="corr",
        reply_to="somewhere",
        expiration="60000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="event",
        user_id="guest",
        app_id="tests",
    )
    channel.basic_publish("", queue, b'{"k": 1}', props)
    _method, got, body = channel.basic_get(queue, auto_ack=True)
    assert body == b'{"k": 1}'
    for name in (
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        assert getattr(got, name) == getattr(props, name), name
    assert got.headers == props.headers


@pytest.mark.parametrize("size", [1024 * 1024, 5 * 1024 * 1024])
def test_large_message_round_trip(connect: Connect, size: int) -> None:
    conn = connect()
    ch = conn.channel()
    queue = anon_queue(ch)
    payload = os.urandom(size)
    ch.confirm_delivery()
    ch.basic_publish("", queue, payload)
    ch.basic_publish("", queue, payload[::-1])

    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert method.message_count == 1
    assert len(body) == size
    assert body == payload

    got: list[bytes] = []
    ch.basic_consume(queue, lambda _ch, _m, _p, body: got.append(body), auto_ack=True)
    assert pump(conn, until=lambda: bool(got), timeout=15)
    assert len(got[0]) == size
    assert got[0] == payload[::-1]


def test_empty_body_round_trip(channel: BlockingChannel) -> None:
    queue = anon_queue(channel)
    channel.basic_publish("", queue, b"")
    method, _props, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None
    assert body == b""


# -- more of what real applications run into ----------------------------------------------------


def test_global_qos_shared_by_the_channels_consumers(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    q1, q2 = anon_queue(ch), anon_queue(ch)
    for i in range(5):
        ch.basic_publish("", q1, f"a{i}".encode())
        ch.basic_publish("", q2, f"b{i}".encode())
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got: list[tuple[bytes, bool, int]] = []
    _consume_into(ch, q1, got)
    _consume_into(ch, q2, got)
    assert pump(conn, until=lambda: len(got) >= 3)
    pump_for(conn, seconds=0.3)
    assert len(got) == 3  # three in flight across both consumers
    ch.basic_ack(0, multiple=True)
    assert pump(conn, until=lambda: len(got) >= 6)
    pump_for(conn, seconds=0.3)
    assert len(got) == 6
    assert message_count(ch, q1) + message_count(ch, q2) == 4


def test_requeued_messages_keep_their_original_order(channel: BlockingChannel) -> None:
    queue = anon_queue(channel)
    for i in range(5):
        channel.basic_publish("", queue, f"o{i}".encode())
    tags = [channel.basic_get(queue)[0].delivery_tag for _ in range(3)]  # o0, o1, o2
    channel.basic_nack(tags[2], requeue=True)
    channel.basic_nack(tags[0], requeue=True)
    got = []
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((body, method.redelivered))
    assert got == [(b"o0", True), (b"o2", True), (b"o3", False), (b"o4", False)]
    channel.basic_ack(tags[1])


def test_exclusive_consumer_refuses_others_403(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("solo")
    ch.basic_consume("solo", lambda *_: None, exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().basic_consume("solo", lambda *_: None)
    assert excinfo.value.reply_code == 403

    # Asking for exclusivity on a queue that already has a consumer is refused too.
    ch2 = conn.channel()
    other = connect().channel()
    other.queue_declare("shared")
    other.basic_consume("shared", lambda *_: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch2.basic_consume("shared", lambda *_: None, exclusive=True)
    assert excinfo.value.reply_code == 403


def test_ack_after_cancel_and_after_queue_deletion(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("short-lived")
    for body in (b"p", b"q"):
        ch.basic_publish("", "short-lived", body)
    got: list[tuple[bytes, bool, int]] = []
    tag = _consume_into(ch, "short-lived", got)
    assert pump(conn, until=lambda: len(got) == 2)

    ch.basic_cancel(tag)
    ch.basic_ack(got[0][2])  # acking after the consumer is gone is fine
    assert message_count(ch, "short-lived") == 0

    connect().channel().queue_delete("short-lived")
    ch.basic_ack(got[1][2])  # ... and after its queue is gone
    ch.queue_declare("", exclusive=True)  # a round trip: the channel is still open
    assert ch.is_open


def test_exchange_delete_if_unused(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    ch.exchange_declare("in-use", exchange_type="direct")
    queue = anon_queue(ch)
    ch.queue_bind(queue, "in-use", "k")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.exchange_delete("in-use", if_unused=True)
    assert excinfo.value.reply_code == 406
    ch = conn.channel()
    ch.queue_unbind(queue, "in-use", "k")
    ch.exchange_delete("in-use", if_unused=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.exchange_declare("in-use", passive=True)
    assert excinfo.value.reply_code == 404


def test_large_message_with_small_client_frame_max(tqbroker_thread: RunningBroker) -> None:
    params = pika.URLParameters(tqbroker_thread.url)
    params.frame_max = 4096  # the smallest a client may ask for
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        queue = anon_queue(ch)
        payload = os.urandom(1024 * 1024 + 17)
        ch.basic_publish("", queue, payload)
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None
        assert body == payload
    finally:
        conn.close()


def test_heartbeats_keep_an_idle_connection_open(tqbroker_thread: RunningBroker) -> None:
    params = pika.URLParameters(tqbroker_thread.url)
    params.heartbeat = 1  # pika and the broker negotiate the lower value: 1 s
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        queue = anon_queue(ch)
        conn.process_data_events(time_limit=3.5)  # idle well past two intervals
        assert conn.is_open
        ch.basic_publish("", queue, b"still here")
        assert drain(ch, queue) == [b"still here"]
    finally:
        conn.close()


def test_slow_consumer_gets_everything_in_order(connect: Connect) -> None:
    """More than the broker buffers for one client (20 MiB): deliveries pause and resume."""
    producer = connect().channel()
    producer.queue_declare("firehose")
    consumer_conn = connect()
    ch = consumer_conn.channel()
    got: list[bytes] = []
    ch.basic_consume("firehose", lambda _ch, _m, _p, body: got.append(body), auto_ack=True)

    chunk = b"x" * (10 * 1024)
    count = 2000
    for i in range(count):
        producer.basic_publish("", "firehose", i.to_bytes(4, "big") + chunk)
    message_count(producer, "firehose")  # a round trip: everything was routed
    time.sleep(0.3)  # the consumer is not reading meanwhile

    assert pump(consumer_conn, until=lambda: len(got) >= count, timeout=20)
    pump_for(consumer_conn, seconds=0.1)
    assert len(got) == count
    assert [int.from_bytes(body[:4], "big") for body in got] == list(range(count))
    assert all(body[4:] == chunk for body in got)


def test_consume_generator_with_inactivity_timeout_and_cancel(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    queue = anon_queue(ch)
    for i in range(5):
        ch.basic_publish("", queue, f"g{i}".encode())
    ch.basic_qos(prefetch_count=5)

    bodies = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=2):
        assert method is not None, "timed out waiting for a message"
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == 2:
            break
    # pika rejects (requeue) what was delivered but not handed out (g2..g4), including what
    # arrives before cancel-ok.
    ch.cancel()
    assert bodies == [b"g0", b"g1"]
    rest = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        rest.append((body, method.redelivered))
    assert rest == [(b"g2", True), (b"g3", True), (b"g4", True)]

    # With nothing to deliver, the generator yields (None, None, None) after the timeout.
    started = time.monotonic()
    assert next(ch.consume(queue, inactivity_timeout=0.3)) == (None, None, None)
    assert time.monotonic() - started >= 0.25
    ch.cancel()


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-max-length": -1},
        {"x-max-length": "ten"},
        {"x-max-length-bytes": -5},
        {"x-expires": 0},
        {"x-message-ttl": -1},
        {"x-overflow": "explode"},
        {"x-max-priority": 256},
        {"x-dead-letter-routing-key": "rk"},
        {"x-single-active-consumer": "yes"},
        {"x-queue-mode": "eager"},
    ],
    ids=lambda args: next(iter(args)),
)
def test_invalid_queue_arguments_are_refused_with_406(
    connect: Connect, arguments: dict[str, object]
) -> None:
    """RabbitMQ (checked against 3.10.8) refuses ill-typed or out-of-range queue arguments."""
    ch = connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.queue_declare("bad-args", arguments=arguments)
    assert refused.value.reply_code == 406
    assert f"invalid arg '{next(iter(arguments))}'" in refused.value.reply_text


def test_consumer_priority_must_be_an_integer(connect: Connect) -> None:
    ch = connect().channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.basic_consume(queue, lambda *a: None, arguments={"x-priority": "high"})
    assert refused.value.reply_code == 406
