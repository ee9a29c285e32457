"""The harness of the reply-text cases (``reply_cases.py``): the case registry and the ways a
case provokes an error and reads the broker's answer (pika channels, raw sockets)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support.rawamqp import RawAMQP, SocketClosed
from tqbroker.protocol.frames import FRAME_METHOD
from tqbroker.protocol.methods import (
    ChannelClose,
    ConnectionClose,
)

Answer = list[Any]  # [code, text] or ["ok"]
Case = Callable[[str, int], Answer]
CASES: dict[str, Case] = {}


def case(function: Case) -> Case:
    CASES[function.__name__.removeprefix("case_")] = function
    return function


def params(
    host: str, port: int, vhost: str = "/", password: str = "guest"
) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host,
        port,
        vhost,
        pika.PlainCredentials("guest", password),
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=10,
    )


@contextlib.contextmanager
def connection(host: str, port: int) -> Iterator[BlockingConnection]:
    conn = pika.BlockingConnection(params(host, port))
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def cleanup(
    host: str, port: int, queues: tuple[str, ...] = (), exchanges: tuple[str, ...] = ()
) -> None:
    """Delete what a case declared (each on its own channel: an exclusive queue of another,
    still open, connection refuses)."""
    with connection(host, port) as conn:
        for queue in queues:
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                conn.channel().queue_delete(queue)
        for exchange in exchanges:
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                conn.channel().exchange_delete(exchange)


def refused(exc: BaseException) -> Answer:
    """The broker's connection.close inside pika's connection-attempt errors."""
    if isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
        return [exc.reply_code, exc.reply_text]
    match = re.search(r"\((\d+)\) '(.*)'$", str(exc))  # pika keeps only the words
    if match is not None:
        return [int(match.group(1)), match.group(2)]
    return ["error", type(exc).__name__]


def channel_case(
    body: Callable[[BlockingConnection, BlockingChannel], None],
    queues: tuple[str, ...] = (),
    exchanges: tuple[str, ...] = (),
) -> Case:
    """A case that runs ``body`` on a fresh channel and reports how the broker closed it."""

    def run(host: str, port: int) -> Answer:
        try:
            with connection(host, port) as conn:
                ch = conn.channel()
                try:
                    body(conn, ch)
                    # an asynchronous refusal (basic.publish, basic.ack) arrives after a round trip
                    ch.queue_declare("", exclusive=True)
                    conn.process_data_events(0.2)
                    ch.queue_declare("", exclusive=True)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    return [exc.reply_code, exc.reply_text]
                except pika.exceptions.ConnectionClosedByBroker as exc:
                    return [exc.reply_code, exc.reply_text]
            return ["ok"]
        finally:
            cleanup(host, port, queues, exchanges)

    return run


def declare_twice(first: dict[str, Any], second: dict[str, Any], queue: str) -> Case:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare(queue, **first)
        ch.queue_declare(queue, **second)

    return channel_case(body, queues=(queue,))


def declare(queue: str, **kwargs: Any) -> Case:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare(queue, **kwargs)

    return channel_case(body, queues=(queue,))


def args_case(queue: str, arguments: dict[str, Any], durable: bool = False, **kwargs: Any) -> Case:
    return declare(queue, durable=durable, arguments=arguments, **kwargs)


def read_close(raw: RawAMQP) -> Answer:
    """The first channel.close or connection.close the broker sends (after ``raw`` provoked
    one), answered."""
    while True:
        got = raw.next_frame()
        method = got.method if got.type == FRAME_METHOD else None
        if isinstance(method, ChannelClose | ConnectionClose):
            return [method.reply_code, method.reply_text]


def raw_case(*provoke: Callable[[RawAMQP], object]) -> Case:
    """A case that sends, after the handshake, what each of ``provoke`` sends, in order."""

    def run(host: str, port: int) -> Answer:
        with RawAMQP(host, port) as raw:
            raw.handshake()
            for step in provoke:
                step(raw)
            try:
                return read_close(raw)
            except SocketClosed:
                return ["socket closed"]
            except TimeoutError:
                return ["no answer"]

    return run
