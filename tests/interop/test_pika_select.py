"""pika SelectConnection (callback style) against the broker.

The IOLoop runs in the test thread, bounded by a deadline; callbacks only record what happened
and the assertions run after the loop stops.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pika.adapters.select_connection import IOLoop, SelectConnection
from pika.channel import Channel
from pika.spec import Basic, BasicProperties

from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(30)


class Loop:
    """One IOLoop shared by any number of SelectConnections."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ioloop = IOLoop()
        self.connections: list[SelectConnection] = []
        self.errors: list[str] = []
        self.timed_out = False

    def connect(self, on_channel: Callable[[SelectConnection, Channel], None]) -> None:
        """Open a connection and one channel on it, then call ``on_channel``."""

        def on_open(conn: SelectConnection) -> None:
            conn.channel(on_open_callback=lambda ch: on_channel(conn, ch))

        def on_open_error(_conn: SelectConnection, err: BaseException) -> None:
            self.fail(f"connection failed: {err!r}")

        conn = SelectConnection(
            pika.URLParameters(self.url),
            on_open_callback=on_open,
            on_open_error_callback=on_open_error,
            custom_ioloop=self.ioloop,
        )
        self.connections.append(conn)

    def fail(self, why: str) -> None:
        self.errors.append(why)
        self.ioloop.stop()

    def stop(self) -> None:
        self.ioloop.stop()

    def run(self, timeout: float = 10.0) -> None:
        def on_timeout() -> None:
            self.timed_out = True
            self.ioloop.stop()

        timer = self.ioloop.call_later(timeout, on_timeout)
        self.ioloop.start()
        self.ioloop.remove_timeout(timer)

    def close(self) -> None:
        """Close every connection and wait (briefly) for the close handshakes."""
        pending = [c for c in self.connections if not (c.is_closed or c.is_closing)]
        if not pending:
            self.ioloop.close()
            return
        for conn in pending:
            conn.add_on_close_callback(
                lambda *_: (
                    self.ioloop.stop() if all(c.is_closed for c in self.connections) else None
                )
            )
            conn.close()
        timer = self.ioloop.call_later(3, self.ioloop.stop)
        self.ioloop.start()
        self.ioloop.remove_timeout(timer)
        self.ioloop.close()


@pytest.fixture
def loop(tqbroker_thread: RunningBroker) -> Iterator[Loop]:
    loop = Loop(tqbroker_thread.url)
    yield loop
    loop.close()


def test_publish_consume_with_acks(loop: Loop) -> None:
    sent = [f"msg {i}".encode() for i in range(100)]
    received: list[tuple[bytes, bool, str | None]] = []
    cancelled: list[str] = []

    def on_channel(_conn: SelectConnection, ch: Channel) -> None:
        def on_declared(frame: Any) -> None:
            queue = frame.method.queue
            ch.basic_qos(prefetch_count=10, callback=lambda _f: start(queue))

        def start(queue: str) -> None:
            def on_message(
                ch: Channel, method: Basic.Deliver, props: BasicProperties, body: bytes
            ) -> None:
                received.append((body, method.redelivered, props.content_type))
                ch.basic_ack(method.delivery_tag)
                if len(received) == len(sent):
                    ch.basic_cancel(tag, callback=lambda f: on_cancel_ok(f))

            def on_cancel_ok(frame: Any) -> None:
                cancelled.append(frame.method.consumer_tag)
                # Everything was acked: the queue must be empty now.
                ch.queue_declare(queue, passive=True, callback=on_final)

            tag = ch.basic_consume(queue, on_message)
            for body in sent:
                ch.basic_publish("", queue, body, pika.BasicProperties(content_type="text/plain"))

        ch.queue_declare("", exclusive=True, callback=on_declared)

    final: list[tuple[int, int]] = []

    def on_final(frame: Any) -> None:
        final.append((frame.method.message_count, frame.method.consumer_count))
        loop.stop()

    loop.connect(on_channel)
    loop.run()
    assert not loop.errors
    assert not loop.timed_out
    assert received == [(body, False, "text/plain") for body in sent]
    assert len(cancelled) == 1
    assert final == [(0, 0)]


def test_publisher_confirms_and_mandatory_return_before_ack(loop: Loop) -> None:
    n = 50
    events: list[tuple[str, Any]] = []
    acked: set[int] = set()
    nacked: list[int] = []
    seq = 0
    unroutable_seq: list[int] = []

    def on_channel(_conn: SelectConnection, ch: Channel) -> None:
        def on_confirm(frame: Any) -> None:
            method = frame.method
            if isinstance(method, Basic.Nack):
                nacked.append(method.delivery_tag)
                return
            tags = range(1, method.delivery_tag + 1) if method.multiple else [method.delivery_tag]
            acked.update(tags)
            events.append(("ack", method.delivery_tag))
            if len(acked) >= n + 1:
                loop.stop()

        def on_return(
            _ch: Channel, method: Basic.Return, _props: BasicProperties, body: bytes
        ) -> None:
            events.append(("return", (method.reply_code, method.routing_key, body)))

        def publish_all(frame: Any) -> None:
            nonlocal seq
            queue = frame.method.queue
            for i in range(n):
                if i == n // 2:
                    ch.basic_publish("", "nowhere", b"unroutable", mandatory=True)
                    seq += 1
                    unroutable_seq.append(seq)
                ch.basic_publish("", queue, f"c{i}".encode(), mandatory=True)
                seq += 1

        ch.add_on_return_callback(on_return)
        ch.confirm_delivery(
            on_confirm,
            callback=lambda _f: ch.queue_declare("", exclusive=True, callback=publish_all),
        )

    loop.connect(on_channel)
    loop.run()
    assert not loop.errors
    assert not loop.timed_out
    assert nacked == []
    assert acked == set(range(1, n + 2))
    returns = [i for i, (kind, _) in enumerate(events) if kind == "return"]
    assert [events[i][1] for i in returns] == [(312, "nowhere", b"unroutable")]
    # The basic.return precedes the ack that covers the unroutable publish.
    [unroutable] = unroutable_seq
    first_covering_ack = next(
        i for i, (kind, tag) in enumerate(events) if kind == "ack" and tag >= unroutable
    )
    assert returns[0] < first_covering_ack


def test_rpc_between_two_connections(loop: Loop) -> None:
    requests = {str(uuid.uuid4()): n for n in range(10)}
    responses: dict[str, bytes] = {}
    server_ready: list[bool] = []

    def on_server_channel(_conn: SelectConnection, ch: Channel) -> None:
        def on_request(
            ch: Channel, method: Basic.Deliver, props: BasicProperties, body: bytes
        ) -> None:
            ch.basic_publish(
                "",
                props.reply_to,
                str(int(body) * 2).encode(),
                pika.BasicProperties(correlation_id=props.correlation_id),
            )
            ch.basic_ack(method.delivery_tag)

        def on_declared(_frame: Any) -> None:
            ch.basic_consume("select_rpc", on_request)
            server_ready.append(True)
            loop.connect(on_client_channel)

        ch.queue_declare("select_rpc", auto_delete=True, callback=on_declared)

    def on_client_channel(_conn: SelectConnection, ch: Channel) -> None:
        def on_response(
            _ch: Channel, _method: Basic.Deliver, props: BasicProperties, body: bytes
        ) -> None:
            responses[props.correlation_id] = body
            if len(responses) == len(requests):
                loop.stop()

        def on_declared(frame: Any) -> None:
            callback_queue = frame.method.queue
            ch.basic_consume(callback_queue, on_response, auto_ack=True)
            for corr_id, n in requests.items():
                ch.basic_publish(
                    "",
                    "select_rpc",
                    str(n).encode(),
                    pika.BasicProperties(reply_to=callback_queue, correlation_id=corr_id),
                )

        ch.queue_declare("", exclusive=True, callback=on_declared)

    loop.connect(on_server_channel)
    loop.run()
    assert not loop.errors
    assert not loop.timed_out
    assert server_ready == [True]
    assert responses == {corr_id: str(n * 2).encode() for corr_id, n in requests.items()}


def test_channel_error_is_reported_to_on_close_callback(loop: Loop) -> None:
    closed: list[tuple[int, str]] = []

    def on_channel(_conn: SelectConnection, ch: Channel) -> None:
        def on_close(_ch: Channel, reason: BaseException) -> None:
            closed.append((reason.reply_code, reason.reply_text))  # type: ignore[attr-defined]
            loop.stop()

        ch.add_on_close_callback(on_close)
        ch.queue_declare("missing-queue", passive=True, callback=lambda _f: loop.fail("ok?"))

    loop.connect(on_channel)
    loop.run()
    assert not loop.errors
    assert not loop.timed_out
    assert len(closed) == 1
    assert closed[0][0] == 404
    assert "missing-queue" in closed[0][1]
    assert loop.connections[0].is_open  # a channel error leaves the connection open
