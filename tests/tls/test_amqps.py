"""amqps with real clients (pika, kombu, aio-pika) over loopback: server-only TLS and mutual TLS
(verify_peer + fail_if_no_peer_cert); the management API's TLS fields of the connection; the
client certificate's user carried to the handshake (EXTERNAL's); HTTPS on the HTTP API and
metrics ports."""

from __future__ import annotations

import asyncio
import gc
import ssl
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import httpx
import kombu
import pika
import pytest

from tests.support.polling import eventually
from tqbroker.server.handshake import Handshake
from tqbroker.server.listener import Listening

from .harness import HOST, Pki, client_context, tls_broker, tls_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server_only(pki: Pki) -> Iterator[Listening]:
    with tls_broker(tls_config(pki, http=True)) as listening:
        yield listening


@pytest.fixture(scope="module")
def mutual(pki: Pki) -> Iterator[Listening]:
    tls = tls_config(pki, verify_peer=True, fail_if_no_peer_cert=True, http=True)
    with tls_broker(tls) as listening:
        yield listening


def pika_connection(
    listening: Listening, pki: Pki, cert: Path | None = None
) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        HOST,
        listening.amqps[0][1],
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(client_context(pki, cert), HOST),
        client_properties={"connection_name": "tls-test"},
    )
    return pika.BlockingConnection(params)


def round_trip_pika(listening: Listening, pki: Pki, cert: Path | None = None) -> None:
    connection = pika_connection(listening, pki, cert)
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"over tls")
    _method, _props, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"over tls"
    connection.close()


def round_trip_kombu(listening: Listening, pki: Pki, cert: Path | None = None) -> None:
    options = {"ca_certs": str(pki.ca), "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": HOST}
    if cert is not None:
        options["certfile"] = str(cert)
    url = f"amqp://guest:guest@{HOST}:{listening.amqps[0][1]}//"
    with (
        kombu.Connection(url, ssl=options, connect_timeout=10) as connection,
        connection.SimpleQueue("kombu-tls", queue_opts={"auto_delete": True}) as simple,
    ):
        simple.put({"over": "tls"})
        message = simple.get(timeout=10)
        assert message.payload == {"over": "tls"}
        message.ack()


def round_trip_aio_pika(listening: Listening, pki: Pki, cert: Path | None = None) -> None:
    async def main() -> None:
        url = f"amqps://guest:guest@{HOST}:{listening.amqps[0][1]}/"
        connection = await aio_pika.connect(url, ssl_context=client_context(pki, cert), timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("", exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"aio"), queue.name)
            message = await queue.get(timeout=10)
            assert message is not None
            assert message.body == b"aio"
            await message.ack()

    asyncio.run(main())


CLIENTS = [round_trip_pika, round_trip_kombu, round_trip_aio_pika]


@pytest.mark.parametrize("round_trip", CLIENTS, ids=["pika", "kombu", "aio-pika"])
def test_server_only_tls(server_only: Listening, pki: Pki, round_trip: object) -> None:
    round_trip(server_only, pki)  # type: ignore[operator]


@pytest.mark.parametrize("round_trip", CLIENTS, ids=["pika", "kombu", "aio-pika"])
def test_mutual_tls(mutual: Listening, pki: Pki, round_trip: object) -> None:
    round_trip(mutual, pki, pki.client)  # type: ignore[operator]


def connection_json(listening: Listening, pki: Pki, cert: Path | None = None) -> dict[str, object]:
    """The management API's view of the one connection named tls-test (over HTTPS)."""
    with httpx.Client(
        base_url=f"https://{HOST}:{listening.http[0][1]}",
        auth=("guest", "guest"),
        verify=client_context(pki, cert),
        timeout=10,
    ) as api:
        found = eventually(
            lambda: [
                c
                for c in api.get("/api/connections").json()
                if c["user_provided_name"] == "tls-test"
            ]
        )
    assert len(found) == 1, found
    return found[0]


def test_management_api_shows_tls_and_the_certificate(mutual: Listening, pki: Pki) -> None:
    connection = pika_connection(mutual, pki, pki.client)
    try:
        shown = connection_json(mutual, pki, pki.client)
        assert shown["ssl"] is True
        assert shown["ssl_protocol"] in ("tlsv1.3", "tlsv1.2")
        # As RabbitMQ 3.10.8 shows a TLS 1.3 connection (loopback oracle, pika, the defaults).
        if shown["ssl_protocol"] == "tlsv1.3":
            assert shown["ssl_cipher"] == "aes_256_gcm"
            assert (shown["ssl_key_exchange"], shown["ssl_hash"]) == ("any", "aead")
        subject = str(shown["peer_cert_subject"])
        assert subject.startswith("CN=alice,OU=Testing cert #"), subject
        assert "O=tqbroker tests" in str(shown["peer_cert_issuer"])
        start, _, end = str(shown["peer_cert_validity"]).partition(" - ")
        assert start.endswith("Z")
        assert end > start
        # The certificate's CN reached the handshake (EXTERNAL's user).
        handshakes = [o for o in gc.get_objects() if isinstance(o, Handshake)]
        assert "alice" in {h.peer_username for h in handshakes}
    finally:
        connection.close()


def test_plain_connection_fields_are_null(server_only: Listening, pki: Pki) -> None:
    connection = pika_connection(server_only, pki)  # server-only: no client certificate
    try:
        shown = connection_json(server_only, pki)
        assert shown["ssl"] is True
        assert shown["peer_cert_subject"] is None
        assert shown["peer_cert_validity"] is None
        handshakes = [o for o in gc.get_objects() if isinstance(o, Handshake)]
        assert all(h.peer_username is None for h in handshakes)
    finally:
        connection.close()
    plain = pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST, server_only.amqp[0][1], client_properties={"connection_name": "tls-test"}
        )
    )
    try:
        shown = connection_json(server_only, pki)
        assert shown["ssl"] is False
        assert shown["ssl_protocol"] is None
        assert shown["ssl_cipher"] is None
        assert shown["peer_cert_issuer"] is None
    finally:
        plain.close()


@pytest.mark.parametrize("port", ["http", "metrics"])
def test_https_ports(mutual: Listening, pki: Pki, port: str) -> None:
    bound = mutual.http if port == "http" else mutual.metrics
    url = f"https://{HOST}:{bound[0][1]}"
    path = "/api/overview" if port == "http" else "/metrics"
    with httpx.Client(verify=client_context(pki, pki.client), timeout=10) as client:
        response = client.get(url + path, auth=("guest", "guest"))
        assert response.status_code == 200
    # fail_if_no_peer_cert holds on the HTTP ports too; plain HTTP is not served there.
    with pytest.raises(httpx.TransportError):
        httpx.get(url + path, verify=client_context(pki), timeout=10)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{HOST}:{bound[0][1]}{path}", timeout=10)
