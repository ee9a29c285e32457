"""The Kafka listener over TLS (``kafka_tls_port``, with the ``[tls]`` certificate: Kafka's SSL
and SASL_SSL security protocols), with a trustme PKI: kafka-python, confluent-kafka, aiokafka
and Debian's kcat produce and consume over SSL, and each logs in with SASL PLAIN over SASL_SSL;
with ``verify_peer`` and ``fail_if_no_peer_cert`` a client without a certificate is refused in
the handshake, and one whose certificate names a user (CN=alice) acts as that user, as Kafka's
SSL listener takes the certificate's principal."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.kafka_listener.raw import exchange
from tests.tls.harness import Pki, client_context, make_pki, tls_config
from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)
ALL = {"configure": ".*", "write": ".*", "read": ".*"}
PLAIN = {"mechanism": "PLAIN", "user": "carol", "password": "c4rol"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _users(running: RunningBroker, topics: list[str], names: list[str]) -> None:
    with httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as http:
        for topic in topics:
            assert http.put(f"/topics/{topic}", json={"partitions": 1}).status_code == 201
        for name in names:
            body = {"password": "c4rol", "tags": ""}
            assert http.put(f"/api/users/{name}", json=body).status_code == 201
            assert http.put(f"/api/permissions/%2F/{name}", json=ALL).status_code == 201


@pytest.fixture(scope="module")
def broker(pki: Pki) -> Iterator[RunningBroker]:
    with running_broker(BrokerConfig(port=0, tls=tls_config(pki))) as running:
        _users(running, ["tls-kp", "tls-ck", "tls-aio", "tls-kcat"], ["carol"])
        yield running


def kafka_python(bootstrap: str, pki: Pki, topic: str, sasl: dict[str, str] | None) -> list[bytes]:
    settings: dict[str, Any] = {"security_protocol": "SSL", "ssl_cafile": str(pki.ca)}
    if sasl is not None:
        settings = {
            "security_protocol": "SASL_SSL",
            "ssl_cafile": str(pki.ca),
            "sasl_mechanism": sasl["mechanism"],
            "sasl_plain_username": sasl["user"],
            "sasl_plain_password": sasl["password"],
        }
    producer = KafkaProducer(bootstrap_servers=bootstrap, **settings)
    producer.send(topic, value=b"kafka-python").get(10)
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
        **settings,
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        return [r.value for r in consumer]
    finally:
        consumer.close()


def confluent(bootstrap: str, pki: Pki, topic: str, sasl: dict[str, str] | None) -> list[bytes]:
    settings = {"bootstrap.servers": bootstrap, "security.protocol": "SSL"}
    settings["ssl.ca.location"] = str(pki.ca)
    if sasl is not None:
        settings["security.protocol"] = "SASL_SSL"
        settings["sasl.mechanism"] = sasl["mechanism"]
        settings["sasl.username"] = sasl["user"]
        settings["sasl.password"] = sasl["password"]
    producer = Producer(settings)
    delivered: list[Any] = []
    producer.produce(topic, b"confluent", on_delivery=lambda e, m: delivered.append(e))
    producer.flush(10)
    assert delivered == [None]
    consumer = Consumer({**settings, "group.id": f"{topic}-g", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        message = None
        for _ in range(20):
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                return [message.value() or b""]
        raise AssertionError(f"nothing consumed ({message and message.error()})")
    finally:
        consumer.close()


def aiokafka(bootstrap: str, pki: Pki, topic: str, sasl: dict[str, str] | None) -> list[bytes]:
    settings: dict[str, Any] = {"security_protocol": "SSL", "ssl_context": client_context(pki)}
    if sasl is not None:
        settings["security_protocol"] = "SASL_SSL"
        settings["sasl_mechanism"] = sasl["mechanism"]
        settings["sasl_plain_username"] = sasl["user"]
        settings["sasl_plain_password"] = sasl["password"]

    async def round_trip() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **settings)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aiokafka", partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **settings
        )
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), 10)
            return [message.value]
        finally:
            await consumer.stop()

    return asyncio.run(round_trip())


CLIENTS = {"tls-kp": kafka_python, "tls-ck": confluent, "tls-aio": aiokafka}


@pytest.mark.parametrize("topic", sorted(CLIENTS))
def test_ssl_and_sasl_ssl(broker: RunningBroker, pki: Pki, topic: str) -> None:
    client = CLIENTS[topic]
    first = client(broker.kafka_tls_bootstrap, pki, topic, None)  # SSL: guest from loopback
    assert first
    assert len(client(broker.kafka_tls_bootstrap, pki, topic, PLAIN)) >= len(first)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_over_ssl(broker: RunningBroker, pki: Pki) -> None:
    ssl_flags = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={pki.ca}"]
    common = ["kcat", "-b", broker.kafka_tls_bootstrap, *ssl_flags, "-t", "tls-kcat"]
    subprocess.run([*common, "-P", "-p", "0"], input=b"one\ntwo\n", check=True, timeout=30)
    consumed = subprocess.run(
        [*common, "-C", "-o", "beginning", "-e", "-q"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert consumed.stdout.split() == [b"one", b"two"]
    # SASL PLAIN over SASL_SSL: librdkafka 2.0.2 logs in only where SaslHandshake 0 is served
    sasl_flags = ["-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={pki.ca}"]
    sasl_flags += ["-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=carol"]
    sasl_flags += ["-X", f"sasl.password={PLAIN['password']}"]
    logged_in = subprocess.run(
        [*common[:3], *sasl_flags, "-t", "tls-kcat", "-C", "-o", "beginning", "-e", "-q"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert logged_in.stdout.split() == [b"one", b"two"]


@pytest.fixture(scope="module")
def verifying(pki: Pki) -> Iterator[RunningBroker]:
    tls = tls_config(pki, verify_peer=True, fail_if_no_peer_cert=True)
    with running_broker(BrokerConfig(port=0, tls=tls)) as running:
        _users(running, [], ["alice"])
        with httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as http:
            # alice may read and write nothing: what she is refused shows who she is.
            none = {"configure": "", "write": "", "read": ""}
            assert http.put("/api/permissions/%2F/alice", json=none).status_code == 204
            assert http.put("/topics/tls-v", json={"partitions": 1}).status_code == 201
        yield running


def _tls_socket(bootstrap: str, context: ssl.SSLContext) -> ssl.SSLSocket:
    host, port = bootstrap.split(":")
    return context.wrap_socket(
        socket.create_connection((host, int(port)), timeout=10), server_hostname=host
    )


def test_verify_peer_requires_a_certificate_and_takes_its_user(
    verifying: RunningBroker, pki: Pki, tmp_path: Path
) -> None:
    # No client certificate: in TLS 1.3 the server refuses it after the client's handshake
    # ended, so the refusal is an alert or a closed connection at the first read.
    refused = (ssl.SSLError, OSError, AssertionError)
    with (
        pytest.raises(refused, match=r"alert|closed|reset"),
        _tls_socket(verifying.kafka_tls_bootstrap, client_context(pki)) as raw,
    ):
        exchange(raw, 18, 0, {})
    with _tls_socket(verifying.kafka_tls_bootstrap, client_context(pki, pki.client)) as raw:
        assert exchange(raw, 18, 0, {})["error_code"] == 0
        produce = {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 5000,
            "topic_data": [{"name": "tls-v", "partition_data": [{"index": 0, "records": b""}]}],
        }
        answer = exchange(raw, 0, 3, produce)
        partition = answer["responses"][0]["partition_responses"][0]
        assert partition["error_code"] == 29  # TOPIC_AUTHORIZATION_FAILED: alice, not guest
