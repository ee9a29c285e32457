"""What a dead-lettered copy says and what x-overflow drop-head leaves, with pika over real
sockets, on tqbroker and on the oracle RabbitMQ (the same scenario run on both; the tqbroker
tests hold it to what RabbitMQ 3.10 answered, the oracle tests check that RabbitMQ still does):

- the ``x-death`` entry of a message rejected or expired in queue Q, published to exchange E
  and dead-lettered through DLX: its ``exchange`` is E (where it was published, not the
  dead-letter exchange), its ``queue`` Q, ``routing-keys`` the published key and its ``CC``,
  and so do the ``x-first-death-*`` headers (and ``x-last-death-*``, RabbitMQ 3.13's);
- a publish that takes a drop-head queue past ``x-max-length-bytes`` by several messages drops
  as many from the head as it takes to fit, each dead-lettered with reason ``maxlen``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.polling import eventually
from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.protocol.codec import FieldValue
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(120)

Death = dict[str, object]


@contextmanager
def _channel(port: int) -> Iterator[BlockingChannel]:
    parameters = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")
    )
    connection = pika.BlockingConnection(parameters)
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


@contextmanager
def _names(channel: BlockingChannel) -> Iterator[dict[str, str]]:
    """Names of their own for E, Q, DLX, DLQ (the oracle is shared by the session's tests),
    deleted afterwards."""
    suffix = uuid.uuid4().hex[:8]
    names = {part: f"{part}-{suffix}" for part in ("E", "Q", "DLX", "DLQ")}
    try:
        yield names
    finally:
        for queue in (names["Q"], names["DLQ"]):
            channel.queue_delete(queue)
        for exchange in (names["E"], names["DLX"]):
            channel.exchange_delete(exchange)


def _dead_letter_copy(channel: BlockingChannel, queue: str) -> tuple[bytes, pika.BasicProperties]:
    def got() -> tuple[bytes, pika.BasicProperties] | None:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        return None if method is None else (body, properties)

    return eventually(got, what=f"the dead-lettered copy in {queue}")


def _x_death_run(port: int, reason: str) -> tuple[Death, dict[str, FieldValue]]:
    """Publish to E (key ``rk``, CC ``cc``), routed to Q whose dead-letter exchange is DLX;
    reject it there (or let it expire); the DLQ copy's x-death[0] (but its time) and its
    x-first-death-* / x-last-death-* headers, with the names as E, Q, DLX."""
    with _channel(port) as channel, _names(channel) as names:
        channel.exchange_declare(names["E"], "direct")
        channel.exchange_declare(names["DLX"], "fanout")
        channel.queue_declare(names["Q"], arguments={"x-dead-letter-exchange": names["DLX"]})
        channel.queue_bind(names["Q"], names["E"], "rk")
        channel.queue_declare(names["DLQ"])
        channel.queue_bind(names["DLQ"], names["DLX"])
        expiration = "20" if reason == "expired" else None
        properties = pika.BasicProperties(headers={"CC": ["cc"]}, expiration=expiration)
        channel.basic_publish(names["E"], "rk", b"job", properties)
        if reason == "rejected":
            method = eventually(lambda: channel.basic_get(names["Q"])[0])
            channel.basic_reject(method.delivery_tag, requeue=False)
        body, copy = _dead_letter_copy(channel, names["DLQ"])
        assert body == b"job"
        as_part = {name: part for part, name in names.items()}
        headers = copy.headers or {}
        [death, *_] = headers["x-death"]
        death = {
            k: as_part.get(v, v) if isinstance(v, str) else v
            for k, v in death.items()
            if k != "time"
        }
        first_last = {
            k: as_part.get(v, v) if isinstance(v, str) else v
            for k, v in headers.items()
            if k.startswith(("x-first-death-", "x-last-death-"))
        }
        return death, first_last


# What RabbitMQ 3.10.8 answered (the oracle test below compares live).
DEATHS: dict[str, Death] = {
    "rejected": {
        "count": 1,
        "reason": "rejected",
        "queue": "Q",
        "exchange": "E",
        "routing-keys": ["rk", "cc"],
    },
    "expired": {
        "count": 1,
        "reason": "expired",
        "queue": "Q",
        "exchange": "E",
        "routing-keys": ["rk", "cc"],
        "original-expiration": "20",
    },
}


def _first_and_last(reason: str, *, last: bool = True) -> dict[str, FieldValue]:
    """The x-first-death-* headers (and RabbitMQ 3.13's x-last-death-*, which 3.10 does not
    send: the oracle is asked for the first ones only)."""
    return {
        f"x-{when}-death-{key}": value
        for when in ("first", "last")
        if last or when == "first"
        for key, value in (("reason", reason), ("queue", "Q"), ("exchange", "E"))
    }


@pytest.mark.parametrize("reason", ["rejected", "expired"])
def test_x_death_names_the_exchange_the_message_was_published_to(
    tqbroker_thread: RunningBroker, reason: str
) -> None:
    death, first_last = _x_death_run(tqbroker_thread.port, reason)
    assert death == DEATHS[reason]
    assert first_last == _first_and_last(reason)


@pytest.mark.timeout(300)  # the oracle's start
@pytest.mark.parametrize("reason", ["rejected", "expired"])
def test_rabbitmq_names_the_same_exchange(rabbitmq_oracle: RabbitMQ, reason: str) -> None:
    death, first_last = _x_death_run(rabbitmq_oracle.port, reason)
    assert death == DEATHS[reason]
    first = {k: v for k, v in first_last.items() if k.startswith("x-first-death-")}
    assert first == _first_and_last(reason, last=False)


def _drop_head_run(port: int) -> tuple[list[bytes], list[tuple[bytes, str]]]:
    """A drop-head queue of at most 12 bytes holding three 4-byte messages (at its limit)
    takes a 10-byte one: what it keeps, and what its dead-letter queue got (body, reason)."""
    with _channel(port) as channel, _names(channel) as names:
        channel.exchange_declare(names["DLX"], "fanout")
        channel.queue_declare(names["DLQ"])
        channel.queue_bind(names["DLQ"], names["DLX"])
        channel.queue_declare(
            names["Q"],
            arguments={"x-max-length-bytes": 12, "x-dead-letter-exchange": names["DLX"]},
        )
        channel.confirm_delivery()
        for body in (b"aaaa", b"bbbb", b"cccc", b"0123456789"):
            channel.basic_publish("", names["Q"], body)
        kept = []
        while (got := channel.basic_get(names["Q"], auto_ack=True))[0] is not None:
            kept.append(got[2])
        dropped: list[tuple[bytes, str]] = []

        def all_accounted_for() -> bool:  # each of the four is kept or dead-lettered
            while (got := channel.basic_get(names["DLQ"], auto_ack=True))[0] is not None:
                [death, *_] = (got[1].headers or {})["x-death"]
                dropped.append((got[2], death["reason"]))
            return len(kept) + len(dropped) >= 4

        eventually(all_accounted_for, what="the dropped heads in the dead-letter queue")
        return kept, dropped


DROP_HEAD = ([b"0123456789"], [(b"aaaa", "maxlen"), (b"bbbb", "maxlen"), (b"cccc", "maxlen")])


def test_drop_head_drops_every_head_a_publish_needs(tqbroker_thread: RunningBroker) -> None:
    assert _drop_head_run(tqbroker_thread.port) == DROP_HEAD


@pytest.mark.timeout(300)  # the oracle's start
def test_rabbitmq_drops_as_many_heads(rabbitmq_oracle: RabbitMQ) -> None:
    assert _drop_head_run(rabbitmq_oracle.port) == DROP_HEAD
