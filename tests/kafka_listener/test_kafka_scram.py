"""SASL SCRAM-SHA-256 and SCRAM-SHA-512 on the Kafka listener (KIP-84) with kafka-python,
confluent-kafka (librdkafka), aiokafka and Debian's kcat (librdkafka 2.0.2, which logs in only
where SaslHandshake version 0 is served; it then speaks version 1): a user whose password was
set through the HTTP API logs in and produces; a wrong password is refused; a user imported
with a RabbitMQ password hash alone has no SCRAM credentials, so SCRAM refuses it
(SASL_AUTHENTICATION_FAILED, 58, saying why) while PLAIN logs it in. Kafka closes the
connection after a failed login (``SaslServerAuthenticator``): the raw exchanges check that."""

from __future__ import annotations

import asyncio
import base64
import shutil
import socket
import struct
import subprocess
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


class KcatFailed(Exception):
    """kcat exited non-zero (a refused login: ``Local: Authentication failure``)."""


def kcat(bootstrap: str, mechanism: str, user: str, password: str) -> int:
    """Produce a record, then read the offset of the last one back, logged in both times."""
    login = [
        *("-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}"),
        *("-X", f"sasl.username={user}", "-X", f"sasl.password={password}"),
    ]
    runs = [(["-P", "-X", "message.timeout.ms=5000"], "kcat\n"), (["-C", "-o", "-1", "-e"], "")]
    out = ""
    for arguments, given in runs:
        done = subprocess.run(
            ["kcat", "-b", bootstrap, "-t", TOPIC, *login, *arguments, "-f", "%o\n"],
            input=given,
            text=True,
            capture_output=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise KcatFailed(done.stderr)
        out = done.stdout
    return int(out.split()[-1])


CLIENTS: list[Any] = [kafka_python, confluent, aiokafka]
if shutil.which("kcat") is not None:
    CLIENTS.append(kcat)
REFUSED = (KafkaError, KafkaException, AIOKafkaError, KcatFailed)


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


def _bare(raw: socket.socket, token: bytes) -> bytes:
    """A token as a bare size-prefixed frame, and the bare frame that answers it."""
    raw.sendall(struct.pack(">i", len(token)) + token)
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = raw.recv(65536)
        assert chunk, "closed before the answer"
        data += chunk
    return data[4:]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_version_0_handshakes_take_bare_tokens(broker: RunningBroker, mechanism: str) -> None:
    """After SaslHandshake version 0 the tokens are frames without a request header, and so
    are the answers (``SaslServerAuthenticator.handleSaslToken``: ``sizePrefixed`` responses
    when ``enableKafkaSaslAuthenticateHeaders`` is off; ``handleHandshakeRequest`` turns it on
    from version 1 only); PLAIN answers with an empty token; a refusal closes the connection,
    version 0 having no error to carry."""
    host, port = broker.kafka_bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        client = ScramClient("carol", "c4rol", mechanism)
        assert exchange(raw, 17, 0, {"mechanism": mechanism})["error_code"] == 0
        client.process_server_first_message(_bare(raw, client.first_message()))
        client.process_server_final_message(_bare(raw, client.final_message()))
        assert exchange(raw, 3, 1, {"topics": None})["topics"]  # logged in: requests again
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        client = ScramClient("carol", "wrong", mechanism)
        assert exchange(raw, 17, 0, {"mechanism": mechanism})["error_code"] == 0
        client.process_server_first_message(_bare(raw, client.first_message()))
        raw.sendall(struct.pack(">i", len(client.final_message())) + client.final_message())
        assert raw.recv(10) == b""
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        assert exchange(raw, 17, 0, {"mechanism": "PLAIN"})["error_code"] == 0
        assert _bare(raw, b"\0hasher\0h4sh") == b""
        assert exchange(raw, 3, 1, {"topics": None})["topics"]
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        assert exchange(raw, 17, 0, {"mechanism": "PLAIN"})["error_code"] == 0
        raw.sendall(struct.pack(">i", 13) + b"\0hasher\0wrong")
        assert raw.recv(10) == b""
