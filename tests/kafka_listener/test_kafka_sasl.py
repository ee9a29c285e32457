"""SASL PLAIN on the Kafka listener (SaslHandshake v1, SaslAuthenticate), the broker's users
and RabbitMQ's permissions: kafka-python logs in as guest and as a user made through the
management API; a user with ``read`` only may fetch and not produce
(TOPIC_AUTHORIZATION_FAILED, 29); a wrong password is SASL_AUTHENTICATION_FAILED (58) and
the connection is closed after it, as Kafka's ``SaslServerAuthenticator`` does."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import TopicAuthorizationFailedError

from tests.kafka_listener.raw import exchange
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SASL = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        with httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as http:
            assert http.put("/topics/sasl-t", json={"partitions": 1}).status_code == 201
            assert (
                http.put("/api/users/alice", json={"password": "pw", "tags": ""}).status_code == 201
            )
            permissions = {"configure": "", "write": "", "read": ".*"}
            assert http.put("/api/permissions/%2F/alice", json=permissions).status_code == 201
        yield running


def test_plain_logins_and_permissions(broker: RunningBroker) -> None:
    producer = KafkaProducer(
        bootstrap_servers=broker.kafka_bootstrap,
        sasl_plain_username="guest",
        sasl_plain_password="guest",
        **SASL,
    )
    assert producer.send("sasl-t", value=b"by guest").get(10).offset == 0
    producer.close()
    reader = KafkaProducer(
        bootstrap_servers=broker.kafka_bootstrap,
        sasl_plain_username="alice",
        sasl_plain_password="pw",
        enable_idempotence=False,
        **SASL,
    )
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            reader.send("sasl-t", value=b"by alice").get(10)
    finally:
        reader.close()
    consumer = KafkaConsumer(
        bootstrap_servers=broker.kafka_bootstrap,
        sasl_plain_username="alice",
        sasl_plain_password="pw",
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        **SASL,
    )
    try:
        consumer.assign([TopicPartition("sasl-t", 0)])
        assert [r.value for r in consumer] == [b"by guest"]
    finally:
        consumer.close()


def test_a_wrong_password_is_refused_and_the_connection_closed(broker: RunningBroker) -> None:
    host, port = broker.kafka_bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        shake = exchange(raw, 17, 1, {"mechanism": "SCRAM-SHA-1"})
        assert (shake["error_code"], shake["mechanisms"]) == (33, MECHANISMS)
        assert exchange(raw, 17, 1, {"mechanism": "PLAIN"})["error_code"] == 0
        answer = exchange(raw, 36, 1, {"auth_bytes": b"\0guest\0wrong"})
        assert answer["error_code"] == 58
        assert answer["error_message"]
        assert raw.recv(10) == b""
