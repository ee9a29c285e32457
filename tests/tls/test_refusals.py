"""What the amqps port refuses, and how: a plaintext AMQP client, a client without a
certificate under fail_if_no_peer_cert, an untrusted and an expired client certificate, a TCP
client that never does its TLS handshake (closed by handshake_timeout). Each is one log line
without a traceback and a closed socket; a client already connected keeps working."""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.support.polling import eventually
from tqbroker.protocol.frames import PROTOCOL_HEADER
from tqbroker.server.listener import Listening
from tqbroker.server.tls import server_context

from .harness import HOST, Pki, client_context, tls_broker, tls_config

pytestmark = pytest.mark.timeout(60)
HANDSHAKE_TIMEOUT = 0.5


@pytest.fixture(scope="module")
def mutual(pki: Pki) -> Iterator[Listening]:
    tls = tls_config(pki, verify_peer=True, fail_if_no_peer_cert=True, http=True)
    with tls_broker(tls, handshake_timeout=HANDSHAKE_TIMEOUT) as listening:
        yield listening


def tls_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return eventually(
        lambda: [r for r in caplog.records if text in r.getMessage()], 5, what=f"{text!r} logged"
    )


def assert_one_clean_line(caplog: pytest.LogCaptureFixture, text: str) -> str:
    lines = tls_lines(caplog, text)
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].exc_info is None
    assert "Traceback" not in caplog.text
    return lines[0].getMessage()


def working_client(listening: Listening, pki: Pki) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST,
            listening.amqps[0][1],
            ssl_options=pika.SSLOptions(client_context(pki, pki.client), HOST),
        )
    )


def amqp_answers(context: ssl.SSLContext, port: int) -> bytes:
    """What the broker answers a TLS client's protocol header: nothing if it is refused (TLS
    1.3: the client's handshake ends before the server has checked its certificate; the refusal,
    an alert or the end of the stream, comes with the first read)."""
    try:
        with (
            socket.create_connection((HOST, port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=HOST) as tls,
        ):
            tls.sendall(PROTOCOL_HEADER)
            return tls.recv(4096)
    except (ssl.SSLError, ConnectionError):
        return b""


def still_works(connection: pika.BlockingConnection) -> None:
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"still here")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"still here"


def test_plaintext_client_on_the_tls_port(
    mutual: Listening, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tqbroker")
    other = working_client(mutual, pki)
    with socket.create_connection((HOST, mutual.amqps[0][1]), timeout=5) as plain:
        plain.sendall(PROTOCOL_HEADER)
        started = time.monotonic()
        received = b""
        while chunk := plain.recv(4096):  # a TLS alert at most, then the end of the stream
            received += chunk
        assert time.monotonic() - started < HANDSHAKE_TIMEOUT, "closed at once, not by a timeout"
        assert not received.startswith(b"\x01\x00\x00"), "no AMQP frame (connection.start)"
    line = assert_one_clean_line(caplog, "TLS handshake with")
    assert "failed" in line
    still_works(other)
    other.close()


@pytest.mark.parametrize("cert", [None, "untrusted", "expired"])
def test_refused_client_certificates(
    mutual: Listening, pki: Pki, caplog: pytest.LogCaptureFixture, cert: str | None
) -> None:
    caplog.set_level(logging.INFO, "tqbroker")
    other = working_client(mutual, pki)
    chain: Path | None = getattr(pki, cert) if cert else None
    context = client_context(pki, chain)
    assert not amqp_answers(context, mutual.amqps[0][1])
    line = assert_one_clean_line(caplog, "TLS handshake with")
    expected = {
        None: "did not return a certificate",
        "untrusted": "unable to get local issuer certificate",
        "expired": "certificate has expired",
    }[cert]
    assert expected in line, line
    # pika is refused as well (its error, not a hang).
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(
            pika.ConnectionParameters(
                HOST,
                mutual.amqps[0][1],
                ssl_options=pika.SSLOptions(context, HOST),
                connection_attempts=1,
                socket_timeout=5,
            )
        )
    still_works(other)
    other.close()


def test_silent_tcp_client_is_closed_by_the_handshake_deadline(
    mutual: Listening, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tqbroker")
    with socket.create_connection((HOST, mutual.amqps[0][1]), timeout=5) as silent:
        started = time.monotonic()
        assert silent.recv(4096) == b""
        waited = time.monotonic() - started
    assert HANDSHAKE_TIMEOUT * 0.8 < waited < HANDSHAKE_TIMEOUT + 2, waited
    assert "timed out" in assert_one_clean_line(caplog, "TLS handshake with")


@pytest.mark.parametrize("port", ["http", "metrics"])
def test_silent_client_of_an_https_port_is_closed_by_the_deadline(
    mutual: Listening, port: str
) -> None:
    bound = mutual.http if port == "http" else mutual.metrics
    with socket.create_connection((HOST, bound[0][1]), timeout=5) as silent:
        started = time.monotonic()
        assert silent.recv(4096) == b""
        waited = time.monotonic() - started
    assert HANDSHAKE_TIMEOUT * 0.8 < waited < HANDSHAKE_TIMEOUT + 2, waited


def test_slow_client_hello_counts_in_the_same_deadline(mutual: Listening, pki: Pki) -> None:
    """A client that sends its hello late and then the AMQP header: the TLS handshake is part
    of handshake_timeout (counted from the accept), so it is closed by the same deadline."""
    context = client_context(pki, pki.client)
    with socket.create_connection((HOST, mutual.amqps[0][1]), timeout=5) as raw:
        time.sleep(HANDSHAKE_TIMEOUT * 0.6)
        started = time.monotonic()
        with context.wrap_socket(raw, server_hostname=HOST) as tls:
            tls.sendall(PROTOCOL_HEADER)
            received = b""
            try:
                while chunk := tls.recv(4096):  # connection.start, then the end of the stream
                    received += chunk
            except (ssl.SSLError, ConnectionError):
                pass
        # Not another full handshake_timeout after the TLS handshake.
        assert time.monotonic() - started < HANDSHAKE_TIMEOUT * 0.8, received[:20]


def test_tls_1_2_accepted_older_refused(mutual: Listening, pki: Pki) -> None:
    context = client_context(pki, pki.client)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    assert amqp_answers(context, mutual.amqps[0][1]).startswith(b"\x01\x00\x00")  # start
    assert server_context(tls_config(pki)).minimum_version == ssl.TLSVersion.TLSv1_2


def test_pending_handshake_limit_counts_tls_handshakes(pki: Pki) -> None:
    """Connections in their TLS handshake count in max_pending_handshakes_per_address: over it,
    a new one is closed at once, before any TLS work."""
    settings = {"max_pending_handshakes_per_address": 2, "handshake_timeout": 10.0}
    with tls_broker(tls_config(pki), **settings) as listening:
        port = listening.amqps[0][1]
        silent = [socket.create_connection((HOST, port), timeout=5) for _ in range(2)]
        try:
            time.sleep(0.2)  # both accepted and admitted
            with socket.create_connection((HOST, port), timeout=5) as third:
                started = time.monotonic()
                assert third.recv(4096) == b""
                assert time.monotonic() - started < 2, "closed at once, not by the deadline"
        finally:
            for sock in silent:
                sock.close()
        time.sleep(0.2)  # their places are given back
        assert amqp_answers(client_context(pki), port).startswith(b"\x01\x00\x00")
