"""The kill -9 checker's clients: pika connections in threads that record into a ``History``.

Every message goes to a durable fanout exchange bound to a classic durable queue and a stream;
its id is in ``message_id`` and at the start of the body. A client's ``run(port, stop)`` works
until ``stop`` is set or the broker dies under it (only a lost connection ends it quietly: any
other error, a nack included, is recorded); its state carries over to the next round.
"""

from __future__ import annotations

import abc
import random
import threading
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from .checker import Delivery, History

EXCHANGE = "chk"
QUEUE = "chk-queue"
STREAM = "chk-stream"
BARRIER_EVERY = 20  # acks


def connect(port: int) -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=5)
    return pika.BlockingConnection(params)


def declare(port: int, backend: str) -> None:
    conn = connect(port)
    ch = conn.channel()
    ch.exchange_declare(EXCHANGE, "fanout", durable=True)
    ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-backend": backend})
    ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_bind(QUEUE, EXCHANGE)
    ch.queue_bind(STREAM, EXCHANGE)
    conn.close()


def counts(port: int) -> tuple[int, int]:
    """The classic queue's ready messages and the stream's durable end."""
    conn = connect(port)
    ch = conn.channel()
    ready = ch.queue_declare(QUEUE, passive=True).method.message_count
    end = ch.queue_declare(STREAM, passive=True).method.message_count
    conn.close()
    return ready, end


def drain(port: int, history: History) -> None:
    """basic.get (and ack) what is left in the classic queue, as consumer ``drain``."""
    conn = connect(port)
    ch = conn.channel()
    while True:
        method, props, _body = ch.basic_get(QUEUE)
        if method is None:
            break
        history.deliver("drain", props.message_id, method.redelivered)
        ch.basic_ack(method.delivery_tag)
    conn.close()


class Client(abc.ABC):
    """A thread per round; ``errors`` keeps whatever ended a run but a lost connection."""

    def __init__(self, name: str, history: History) -> None:
        self.name = name
        self.history = history
        self.errors: list[BaseException] = []

    def start(self, port: int, stop: threading.Event, killed: threading.Event) -> threading.Thread:
        """Run a round in a thread: until ``stop``, or the broker's death (``killed`` is set
        just before the kill: a failed connect, the handshake included, is fine then)."""
        args = (port, stop, killed)
        thread = threading.Thread(target=self._guarded, args=args, name=self.name)
        thread.start()
        return thread

    def _guarded(self, port: int, stop: threading.Event, killed: threading.Event) -> None:
        try:
            conn = connect(port)
            self.run(conn, stop)
            conn.close()
        except (pika.exceptions.StreamLostError, ConnectionError):
            pass  # the broker was killed
        except pika.exceptions.AMQPConnectionError as exc:
            if not killed.is_set() or isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
                self.errors.append(exc)
        except BaseException as exc:
            self.errors.append(exc)

    @abc.abstractmethod
    def run(self, conn: pika.BlockingConnection, stop: threading.Event) -> None:
        """One round's work on ``conn`` until ``stop``."""

    def publish(self, ch: BlockingChannel, msg_id: str) -> bool:
        """Publish ``msg_id`` (persistent) and wait for its confirm: True if acked."""
        body = msg_id.encode() + b" " + b"x" * random.randint(0, 2048)
        props = pika.BasicProperties(delivery_mode=2, message_id=msg_id)
        self.history.attempt(msg_id)
        try:
            ch.basic_publish(EXCHANGE, "", body, props)
        except pika.exceptions.NackError:
            self.history.confirm(msg_id, False)
            self.errors.append(RuntimeError(f"{msg_id} nacked"))
            return False
        self.history.confirm(msg_id, True)
        return True


class Publisher(Client):
    """Confirm mode, one message at a time; a publish whose confirm a crash hid is sent again,
    with the same id, after the reconnect."""

    def __init__(self, name: str, history: History) -> None:
        super().__init__(name, history)
        self.seq = 0
        self.unknown: str | None = None

    def run(self, conn: pika.BlockingConnection, stop: threading.Event) -> None:
        ch = conn.channel()
        ch.confirm_delivery()
        while not stop.is_set():
            if self.unknown is None:
                self.unknown = f"{self.name}-{self.seq}"
                self.seq += 1
            self.publish(ch, self.unknown)
            self.unknown = None


class QueueConsumer(Client):
    """Manual acks, prefetch 50; after every ``BARRIER_EVERY`` acks (and when idle) a confirmed
    publish on the same channel makes the acks before it durable (``Delivery.durable_ack``)."""

    def __init__(self, name: str, history: History) -> None:
        super().__init__(name, history)
        self.barriers = 0
        self.hold = threading.Event()  # set: deliveries are taken but not acked
        self.held = 0  # deliveries taken and not acked this round

    def run(self, conn: pika.BlockingConnection, stop: threading.Event) -> None:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_qos(prefetch_count=50)
        acked: list[Delivery] = []
        for method, props, _body in ch.consume(QUEUE, inactivity_timeout=0.05):
            if method is None:
                if acked:
                    self._barrier(ch, acked)
                if stop.is_set():
                    break
                continue
            d = self.history.deliver(self.name, props.message_id, method.redelivered)
            if self.hold.is_set():
                self.held += 1
                continue
            ch.basic_ack(method.delivery_tag)
            d.acked = True
            acked.append(d)
            if len(acked) >= BARRIER_EVERY:
                self._barrier(ch, acked)
        ch.cancel()

    def _barrier(self, ch: BlockingChannel, acked: list[Delivery]) -> None:
        self.barriers += 1
        if self.publish(ch, f"{self.name}-b{self.barriers}"):
            with self.history.lock:
                for d in acked:
                    d.durable_ack = True
        acked.clear()


class StreamReader(Client):
    """Reads the stream by offset, from ``next_offset`` (0 at first, then last seen + 1 across
    reconnects), acking each delivery (credit); stops at ``until`` if given."""

    def __init__(
        self, name: str, history: History, record: Callable[[int, str], None] | None = None
    ) -> None:
        super().__init__(name, history)
        self.next_offset = 0
        self.until: int | None = None
        self.record = record or (lambda offset, msg_id: history.stream_read(name, offset, msg_id))

    def run(self, conn: pika.BlockingConnection, stop: threading.Event) -> None:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        arguments: dict[str, Any] = {"x-stream-offset": self.next_offset}
        for method, props, _body in ch.consume(
            STREAM, arguments=arguments, inactivity_timeout=0.05
        ):
            if method is not None:
                offset = props.headers["x-stream-offset"]
                self.record(offset, props.message_id)
                self.next_offset = offset + 1
                ch.basic_ack(method.delivery_tag)
            if self.until is not None and self.next_offset >= self.until:
                break
            if method is None and stop.is_set():
                break
        ch.cancel()
