"""SASL SCRAM-SHA-256 and SCRAM-SHA-512 on the Kafka listener (KIP-84) with kafka-python,
confluent-kafka (librdkafka) and aiokafka: a user whose password was set through the HTTP API
logs in and produces; a wrong password is refused; a user imported with a RabbitMQ password
hash alone has no SCRAM credentials, so SCRAM refuses it (SASL_AUTHENTICATION_FAILED, 58,
saying why) while PLAIN logs it in. Kafka closes the connection after a failed login
(``SaslServerAuthenticator``): the raw exchanges check that."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError as AIOKafkaError
from confluent_kafka import KafkaException, Producer
from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.net.sasl.scram import ScramClient

from tests.kafka_listener.raw import exchange
from tqbroker.auth.passwords import hash_password
from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)
MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
TOPIC = "scram-t"
ALL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    # Refusals without the failure delay, and enough of them for the clients' retries.
    config = BrokerConfig(port=0, auth_failure_delay=0.05, auth_failure_burst=10_000)
    with running_broker(config) as running:
        with httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as http:
            assert http.put(f"/topics/{TOPIC}", json={"partitions": 1}).status_code == 201
            users = {
                "carol": {"password": "c4rol", "tags": ""},
                # As a RabbitMQ definitions export has it: a hash, no SCRAM credentials.
                "hasher": {"password_hash": hash_password("h4sh"), "tags": ""},
            }
            for name, body in users.items():
                assert http.put(f"/api/users/{name}", json=body).status_code == 201
                assert http.put(f"/api/permissions/%2F/{name}", json=ALL).status_code == 201
        yield running


def sasl(mechanism: str, user: str, password: str) -> dict[str, str]:
    """kafka-python's and aiokafka's SASL settings (the same names)."""
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def kafka_python(bootstrap: str, mechanism: str, user: str, password: str) -> int:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        **sasl(mechanism, user, password),
        max_block_ms=5000,
        bootstrap_timeout_ms=1500,  # a refused login is retried until then
    )
    try:
        offset: int = producer.send(TOPIC, value=b"kafka-python").get(10).offset
        return offset
    finally:
        producer.close()


def confluent(bootstrap: str, mechanism: str, user: str, password: str) -> int:
    errors: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "message.timeout.ms": 5000,
            "error_cb": errors.append,
        }
    )
    delivered: list[Any] = []
    producer.produce(TOPIC, b"confluent", on_delivery=lambda e, m: delivered.append((e, m)))
    deadline = time.monotonic() + 10
    while not errors and not delivered and time.monotonic() < deadline:
        producer.poll(0.05)  # a refused login reaches error_cb at once: no message timeout
    if errors:
        raise KafkaException(errors[0])
    error, message = delivered[0]
    if error is not None:
        raise KafkaException(error)
    return int(message.offset())


def aiokafka(bootstrap: str, mechanism: str, user: str, password: str) -> int:
    async def produce() -> int:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            **sasl(mechanism, user, password),
            request_timeout_ms=5000,
        )
        await producer.start()
        try:
            return int((await producer.send_and_wait(TOPIC, b"aiokafka")).offset)
        finally:
            await producer.stop()

    return asyncio.run(produce())


CLIENTS = [kafka_python, confluent, aiokafka]
REFUSED = (KafkaError, KafkaException, AIOKafkaError)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.__name__)
def test_scram_logins(broker: RunningBroker, client: Any, mechanism: str) -> None:
    bootstrap = broker.kafka_bootstrap
    assert client(bootstrap, mechanism, "carol", "c4rol") >= 0
    with pytest.raises(REFUSED):
        client(bootstrap, mechanism, "carol", "wrong")
    with pytest.raises(REFUSED):  # a RabbitMQ hash only: no SCRAM credentials
        client(bootstrap, mechanism, "hasher", "h4sh")
    assert client(bootstrap, "PLAIN", "hasher", "h4sh") >= 0


def _scram_first(raw: socket.socket, mechanism: str, client: ScramClient) -> Any:
    shake = exchange(raw, 17, 1, {"mechanism": mechanism})
    assert (shake["error_code"], shake["mechanisms"]) == (0, ["PLAIN", *MECHANISMS])
    return exchange(raw, 36, 1, {"auth_bytes": client.first_message()})


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_exchange_and_its_refusals_on_the_wire(broker: RunningBroker, mechanism: str) -> None:
    host, port = broker.kafka_bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        client = ScramClient("carol", "c4rol", mechanism)
        first = _scram_first(raw, mechanism, client)
        assert first["error_code"] == 0
        client.process_server_first_message(first["auth_bytes"])
        final = exchange(raw, 36, 1, {"auth_bytes": client.final_message()})
        assert final["error_code"] == 0
        client.process_server_final_message(final["auth_bytes"])  # the server's signature
        assert exchange(raw, 3, 1, {"topics": None})["topics"]  # logged in
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        client = ScramClient("carol", "wrong", mechanism)
        client.process_server_first_message(_scram_first(raw, mechanism, client)["auth_bytes"])
        final = exchange(raw, 36, 1, {"auth_bytes": client.final_message()})
        assert (final["error_code"], final["auth_bytes"]) == (58, b"")
        assert "invalid credentials" in final["error_message"]
        assert raw.recv(10) == b""
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        first = _scram_first(raw, mechanism, ScramClient("hasher", "h4sh", mechanism))
        assert first["error_code"] == 58
        assert "no SCRAM credentials" in first["error_message"]
        assert raw.recv(10) == b""
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        proof = base64.b64encode(b"x" * 8).decode()
        bad = exchange(raw, 17, 1, {"mechanism": mechanism})
        assert bad["error_code"] == 0
        answer = exchange(raw, 36, 1, {"auth_bytes": f"c=biws,r=x,p={proof}".encode()})
        assert answer["error_code"] == 58  # a client-final first: not a client-first
        assert raw.recv(10) == b""
