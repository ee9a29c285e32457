"""SASL EXTERNAL end to end: pika over mutual TLS logs in as the user its client certificate
names (CN=alice), with no password; a certificate whose user does not exist is refused, and
EXTERNAL is not offered to a client without a verified certificate."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from tqbroker.config import DEFAULT_USERS, PermissionConfig, UserConfig
from tqbroker.server.listener import Listening

from .harness import HOST, Pki, client_context, tls_broker, tls_config

ALICE = UserConfig("alice", permissions={"/": PermissionConfig()})  # no password


@pytest.fixture(scope="module")
def external(pki: Pki) -> Iterator[Listening]:
    tls = tls_config(pki, verify_peer=True, fail_if_no_peer_cert=False)
    with tls_broker(
        tls, users=(*DEFAULT_USERS, ALICE), auth_mechanisms=("PLAIN", "AMQPLAIN", "EXTERNAL")
    ) as listening:
        yield listening


def connect(
    listening: Listening, pki: Pki, cert: object, credentials: object
) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        HOST,
        listening.amqps[0][1],
        credentials=credentials,
        ssl_options=pika.SSLOptions(client_context(pki, cert), HOST),  # type: ignore[arg-type]
        connection_attempts=1,
    )
    return pika.BlockingConnection(params)


def test_external_logs_in_the_certificates_user(external: Listening, pki: Pki) -> None:
    connection = connect(external, pki, pki.client, pika.credentials.ExternalCredentials())
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"as alice")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"as alice"
    connection.close()


def test_alice_has_no_password_to_log_in_with(external: Listening, pki: Pki) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(external, pki, pki.client, pika.PlainCredentials("alice", ""))


def test_external_without_a_client_certificate_is_not_offered(
    external: Listening, pki: Pki
) -> None:
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(external, pki, None, pika.credentials.ExternalCredentials())


def test_external_for_a_user_that_does_not_exist_is_refused(pki: Pki) -> None:
    tls = tls_config(pki, verify_peer=True)
    with (
        tls_broker(tls, auth_mechanisms=("PLAIN", "EXTERNAL")) as listening,  # no alice
        pytest.raises(pika.exceptions.ProbableAuthenticationError),
    ):
        connect(listening, pki, pki.client, pika.credentials.ExternalCredentials())
