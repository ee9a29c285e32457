"""Idempotent producers: a retried batch lands once.

Kafka's rules (``ProducerAppendInfo.checkSequence``, ``ProducerStateEntry`` in
``storage/src/main/java/org/apache/kafka/storage/internals/log/``; error codes from
``Errors.java``): a batch repeating one of the producer's last five is answered with the
offset it got and not appended again; a sequence that skips ahead is
OUT_OF_ORDER_SEQUENCE_NUMBER (45); an epoch below the producer's is INVALID_PRODUCER_EPOCH
(47); a new epoch starts at sequence 0.

The real clients are driven through a test-owned proxy (the broker advertises it:
``kafka_advertised_address``) that drops the first Produce response and closes the
connection, so that the client retries a batch the broker already wrote: kafka-python 3 (its
producer is idempotent by default), confluent-kafka (librdkafka's ``enable.idempotence``)
and aiokafka (``enable_idempotence``). kcat is librdkafka too, but it exits when its only
broker connection drops ("All broker connections are down: terminating"), before it retries.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import pytest
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer

from tests.kafka_listener.raw import call
from tqbroker.backends.streams import ProducerState
from tqbroker.broker.streams.idempotence import (
    DuplicateSequence,
    InvalidProducerEpoch,
    OutOfOrderSequence,
    RecentBatches,
)
from tqbroker.config import BrokerConfig
from tqbroker.protocol.kafka.records import Record, RecordBatch, encode_batch
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)


class DroppingProxy:
    """Forwards Kafka connections to ``target``; the first Produce response (API key 0) is
    dropped and both sides of its connection closed."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[:2]
        self.target: tuple[str, int] | None = None
        self.dropped = threading.Event()

    def start(self, target: tuple[str, int]) -> None:
        self.target = target
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            assert self.target is not None
            upstream = socket.create_connection(self.target)
            keys: dict[int, int] = {}  # correlation id -> API key
            threading.Thread(
                target=self._pump, args=(client, upstream, keys, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, keys, False), daemon=True
            ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, keys: dict[int, int], requests: bool
    ) -> None:
        try:
            while True:
                frame = _read_frame(source)
                if frame is None:
                    break
                if requests:
                    api_key, _version, correlation = struct.unpack_from(">hhi", frame, 4)
                    keys[correlation] = api_key
                else:
                    (correlation,) = struct.unpack_from(">i", frame, 4)
                    if keys.pop(correlation, None) == 0 and not self.dropped.is_set():
                        self.dropped.set()
                        break  # the answer is lost
                sink.sendall(frame)
        except OSError:
            pass
        finally:
            for end in (source, sink):  # shutdown: the other pump's recv wakes, FIN is sent
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def close(self) -> None:
        self.listener.close()


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    body = _read_exactly(sock, size)
    return None if body is None else head + body


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


@pytest.fixture
def proxied() -> Iterator[tuple[RunningBroker, DroppingProxy]]:
    proxy = DroppingProxy()
    host, port = proxy.address
    config = attrs.evolve(BrokerConfig(), port=0, kafka_advertised_address=f"{host}:{port}")
    with running_broker(config) as broker:
        kafka_host, kafka_port = broker.kafka_bootstrap.split(":")
        proxy.start((kafka_host, int(kafka_port)))
        try:
            yield broker, proxy
        finally:
            proxy.close()


def stored_values(broker: RunningBroker, topic: str) -> list[str]:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        read = http.get(f"/topics/{topic}/messages", params={"offset": 0, "limit": 1000})
        return [m["value"] for m in read.json()["messages"]]


def make_topic(broker: RunningBroker, name: str) -> None:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put(f"/topics/{name}", json={"partitions": 1}).status_code == 201


COUNT = 30


def kafka_python_sends(bootstrap: str, topic: str) -> list[int]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", retries=5
    )
    try:
        sent = [producer.send(topic, b"v%d" % n, partition=0) for n in range(COUNT)]
        return [future.get(timeout=30).offset for future in sent]
    finally:
        producer.close()


def confluent_sends(bootstrap: str, topic: str) -> list[int]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    landed: list[int] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        landed.append(message.offset())

    for n in range(COUNT):
        producer.produce(topic, b"v%d" % n, partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0
    return landed


def aiokafka_sends(bootstrap: str, topic: str) -> list[int]:
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def main() -> list[int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, request_timeout_ms=5000
        )
        await producer.start()
        try:
            sent = [await producer.send(topic, b"v%d" % n, partition=0) for n in range(COUNT)]
            return [(await future).offset for future in sent]
        finally:
            await producer.stop()

    return asyncio.run(main())


@pytest.mark.parametrize("sends", [kafka_python_sends, confluent_sends, aiokafka_sends])
def test_a_retry_after_a_lost_answer_lands_once(
    proxied: tuple[RunningBroker, DroppingProxy], sends: Any
) -> None:
    broker, proxy = proxied
    topic = f"once-{sends.__name__}".replace("_", "-")
    make_topic(broker, topic)
    host, port = proxy.address
    offsets = sends(f"{host}:{port}", topic)
    assert proxy.dropped.is_set()  # a retry happened
    assert sorted(offsets) == list(range(COUNT))
    assert stored_values(broker, topic) == [f"v{n}" for n in range(COUNT)]


def idempotent_batch(producer: int, epoch: int, sequence: int, values: list[bytes]) -> bytes:
    records = tuple(Record(n, 0, None, value) for n, value in enumerate(values))
    return encode_batch(
        RecordBatch(
            0,
            records,
            1000,
            1000,
            producer_id=producer,
            producer_epoch=epoch,
            base_sequence=sequence,
        )
    )


def produce(broker: RunningBroker, topic: str, records: bytes) -> tuple[int, int]:
    body = {
        "acks": -1,
        "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    }
    (answer,) = call(broker.kafka_bootstrap, 0, 7, body)["responses"][0]["partition_responses"]
    return answer["error_code"], answer["base_offset"]


def test_sequences_and_epochs_over_the_wire() -> None:
    with running_broker() as broker:
        make_topic(broker, "seq")
        assert produce(broker, "seq", idempotent_batch(7, 0, 0, [b"a", b"b"])) == (0, 0)
        assert produce(broker, "seq", idempotent_batch(7, 0, 0, [b"a", b"b"])) == (0, 0)  # repeat
        assert produce(broker, "seq", idempotent_batch(7, 0, 5, [b"x"])) == (45, -1)  # a gap
        assert produce(broker, "seq", idempotent_batch(7, 0, 2, [b"c"])) == (0, 2)
        assert produce(broker, "seq", idempotent_batch(7, 1, 3, [b"d"])) == (45, -1)  # not 0
        assert produce(broker, "seq", idempotent_batch(7, 1, 0, [b"d"])) == (0, 3)  # new epoch
        assert produce(broker, "seq", idempotent_batch(7, 0, 3, [b"e"])) == (47, -1)  # fenced
        assert produce(broker, "seq", idempotent_batch(8, 0, 9, [b"f"])) == (0, 4)  # new id
        assert stored_values(broker, "seq") == ["a", "b", "c", "d", "f"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=12), st.data())
def test_retried_batches_land_once_in_order(sizes: list[int], data: st.DataObject) -> None:
    """A producer sends batches of ``sizes`` records in order; any batch may be sent again
    (a retry) any time after it was first sent, once a later one was or not: what is appended
    is every sequence once, in order."""
    recent, state = RecentBatches(), None
    appended: list[int] = []
    sent: list[tuple[int, int]] = []  # (first sequence, count)
    offsets: dict[int, int] = {}
    sequence = 0
    for size in sizes:
        sent.append((sequence, size))
        sequence += size
        for first, count in [sent[-1], *data.draw(st.lists(st.sampled_from(sent), max_size=2))]:
            try:
                duplicate = recent.check(state, 1, 0, first, count)
            except DuplicateSequence:
                continue  # older than the five kept: the client takes it as written
            except (OutOfOrderSequence, InvalidProducerEpoch) as exc:
                raise AssertionError(f"{first}+{count} after {appended}") from exc
            if duplicate is not None:
                assert duplicate.offset == offsets[first]
                continue
            offsets[first] = len(appended)
            state = recent.appended(1, 0, first, count, len(appended))
            appended.extend(range(first, first + count))
    assert appended == list(range(sequence))
    assert state == ProducerState(0, sequence)
