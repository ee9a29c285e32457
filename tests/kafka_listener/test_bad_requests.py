"""Bad requests on the Kafka listener, over raw sockets (``raw.py``), each answered with
Kafka's error code or with the connection closed where Kafka closes it, while a canary client
(kafka-python: a producer and a consumer) keeps producing and consuming on its own
connections; afterwards the broker still serves. Kafka's behaviour, from its source
(apache/kafka @ 1eb7644349cb):

- ``clients/.../network/NetworkReceive.java`` (``readFrom``): a negative size prefix, or one
  over ``socket.request.max.bytes`` (here ``kafka_max_request_bytes``), is an
  ``InvalidReceiveException``, and the connection is closed;
- ``core/.../network/SocketServer.scala`` (``parseRequestHeader``,
  ``processCompletedReceives``): an API key or version not enabled is an
  ``InvalidRequestException``, and the connection is closed ("Closing socket ... because of
  error"); so is a body that does not parse (``RequestContext.parseRequest``: "Error getting
  request for apiKey");
- ``clients/.../requests/RequestContext.java`` (``isUnsupportedApiVersionsRequest``): an
  ApiVersions at a version not served is answered, UNSUPPORTED_VERSION (35) with the served
  ranges in a version 0 body (``ApiVersionsRequest.getErrorResponse``);
- ``storage/.../internals/log/LogValidator.java`` and ``UnifiedLog``: a batch whose CRC fails
  is CORRUPT_MESSAGE (2); ``ReplicaManager.appendToLocalLog``: a topic or partition that does
  not exist is UNKNOWN_TOPIC_OR_PARTITION (3), and nothing of the request is written.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.kafka_listener.raw import call, exchange
from tqbroker.config import BrokerConfig
from tqbroker.protocol.kafka.records import batch_of, encode_batch
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)
MAX_REQUEST = 64 * 1024
CANARY, RAW = "bad-canary", "bad-raw"


class Canary:
    """A kafka-python producer and consumer in a thread, producing and reading back until
    stopped; ``rounds`` counts the records that made the round trip."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.rounds = 0
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap)
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, consumer_timeout_ms=10_000)
        partition = TopicPartition(CANARY, 0)
        consumer.assign([partition])
        try:
            consumer.position(partition)  # the end, fixed before the first record is sent
            while not self._stop.is_set():
                value = b"canary %d" % self.rounds
                producer.send(CANARY, value=value, partition=0).get(10)
                assert next(consumer).value == value
                self.rounds += 1
        except BaseException as exc:
            self.failure = exc
        finally:
            producer.close()
            consumer.close()

    def alive_for(self, rounds: int) -> None:
        """Until ``rounds`` more round trips are made (AssertionError if the canary died)."""
        target, deadline = self.rounds + rounds, time.monotonic() + 30
        while self.rounds < target:
            assert self.failure is None, self.failure
            assert time.monotonic() < deadline, "the canary stalled"
            time.sleep(0.02)

    def __enter__(self) -> Canary:
        self._thread.start()
        self.alive_for(1)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self.failure is None, self.failure


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker(BrokerConfig(port=0, kafka_max_request_bytes=MAX_REQUEST)) as running:
        with httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as http:
            for name in (CANARY, RAW):
                assert http.put(f"/topics/{name}", json={"partitions": 1}).status_code == 201
        yield running


@pytest.fixture
def canary(broker: RunningBroker) -> Iterator[Canary]:
    with Canary(broker.kafka_bootstrap) as running:
        yield running
    # Afterwards the broker still serves a new client.
    check = KafkaConsumer(bootstrap_servers=broker.kafka_bootstrap)
    try:
        assert CANARY in check.topics()
    finally:
        check.close()


def connect(broker: RunningBroker) -> socket.socket:
    host, port = broker.kafka_bootstrap.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed(raw: socket.socket) -> bool:
    """Whether the broker closed ``raw`` (without an answer)."""
    try:
        return raw.recv(100) == b""
    except ConnectionResetError:
        return True


def header(api_key: int, version: int, correlation: int = 1) -> bytes:
    """A request header v1 (client id ``c``)."""
    return struct.pack(">hhih", api_key, version, correlation, 1) + b"c"


def framed(payload: bytes, size: int | None = None) -> bytes:
    return struct.pack(">i", len(payload) if size is None else size) + payload


BAD_FRAMES = {
    # An API key Kafka does not know (SocketServer.parseRequestHeader).
    "unknown API key": framed(header(999, 0)),
    # Metadata at a version not served (SocketServer: "which is not enabled").
    "unsupported Metadata version": framed(header(3, 99) + struct.pack(">i", -1)),
    # A body that ends inside a field: Metadata v1's topics array says 5, then nothing.
    "body ends inside a field": framed(header(3, 1) + struct.pack(">i", 5)),
    # A header that ends inside its client id (RequestHeader.parse).
    "header ends inside a field": framed(struct.pack(">hhih", 3, 1, 1, 50) + b"c"),
    # An empty request (size 0: NetworkReceive takes it; its header does not parse).
    "empty request": framed(b""),
    # A negative size (NetworkReceive: InvalidReceiveException).
    "negative size": struct.pack(">i", -1) + header(18, 0),
    # A size over the limit (NetworkReceive: "larger than" socket.request.max.bytes).
    "oversized request": framed(header(18, 0), MAX_REQUEST + 1),
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_requests_that_close_the_connection(
    broker: RunningBroker, canary: Canary, name: str
) -> None:
    with connect(broker) as raw:
        raw.sendall(BAD_FRAMES[name])
        assert closed(raw)
    canary.alive_for(3)


def test_an_oversized_request_is_closed_before_its_body(
    broker: RunningBroker, canary: Canary
) -> None:
    """The size prefix alone closes it: the broker does not wait for (or buffer) the body."""
    with connect(broker) as raw:
        raw.sendall(struct.pack(">i", 100 * 1024 * 1024))
        assert closed(raw)
    canary.alive_for(3)


def test_a_truncated_request_then_a_close(broker: RunningBroker, canary: Canary) -> None:
    """A size prefix larger than what is sent, then the client closes: the broker drops what
    it had (nothing to answer) and serves on."""
    with connect(broker) as raw:
        raw.sendall(framed(header(18, 0), 1000))
        raw.shutdown(socket.SHUT_WR)
        assert closed(raw)
    canary.alive_for(3)


def test_api_versions_at_an_unsupported_version(broker: RunningBroker, canary: Canary) -> None:
    """UNSUPPORTED_VERSION (35) with the served ranges in a version 0 body, and the connection
    stays open: the client retries at a version it finds there (RequestContext)."""
    with connect(broker) as raw:
        raw.sendall(framed(header(18, 99, correlation=2) + b"\0" * 4))
        reply = raw.recv(4096)
        size, correlation, error, count = struct.unpack(">iihi", reply[:14])
        assert (correlation, error) == (2, 35)
        assert size == len(reply) - 4
        ranges = [struct.unpack(">hhh", reply[14 + 6 * n : 20 + 6 * n]) for n in range(count)]
        assert (18, 0, 3) in ranges
        assert exchange(raw, 18, 0, {})["error_code"] == 0  # still open
    canary.alive_for(3)


def produce_one(topic_name: str, partition: int, records: bytes) -> dict[str, Any]:
    return {
        "acks": -1,
        "timeout_ms": 5000,
        "topic_data": [
            {"name": topic_name, "partition_data": [{"index": partition, "records": records}]}
        ],
    }


def test_bad_batches_get_kafkas_error_codes(broker: RunningBroker, canary: Canary) -> None:
    """CORRUPT_MESSAGE (2) for a wrong CRC, UNKNOWN_TOPIC_OR_PARTITION (3) for a partition or
    a topic that does not exist, INVALID_REQUIRED_ACKS (21) for acks=2 (``ReplicaManager``);
    nothing is written, the connection stays open, and the partition takes a good batch."""
    good = encode_batch(batch_of([(b"k", b"v", [], 5)], 0))
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF
    with connect(broker) as raw:
        for name, partition, records, code in [
            (RAW, 0, bytes(damaged), 2),
            (RAW, 5, good, 3),
            ("bad-none", 0, good, 3),
            (RAW, 0, good, 0),
        ]:
            reply = exchange(raw, 0, 7, produce_one(name, partition, records))
            (answer,) = reply["responses"][0]["partition_responses"]
            assert answer["error_code"] == code, (name, partition)
        assert answer["base_offset"] == 0  # the refused batches took no offset
    invalid_acks = {**produce_one(RAW, 0, good), "acks": 2}
    reply = call(broker.kafka_bootstrap, 0, 7, invalid_acks)
    assert reply["responses"][0]["partition_responses"][0]["error_code"] == 21
    canary.alive_for(3)
