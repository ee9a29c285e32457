"""TLS test helpers: a ``trustme`` PKI written to files (a CA, the broker's certificate for
127.0.0.1, client certificates: good, expired, from an untrusted CA) and brokers with a ``[tls]``
table, run in a thread by ``tqbroker.testing.running_broker`` (its ``Listening`` names the
amqps and HTTPS addresses too)."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trustme

from tqbroker.config import BrokerConfig, TlsConfig
from tqbroker.server.listener import Listening
from tqbroker.testing import running_broker

HOST = "127.0.0.1"


@attrs.frozen
class Pki:
    ca: Path
    cert: Path
    key: Path
    client: Path  # CN=alice: certificate chain and key in one PEM
    expired: Path
    untrusted: Path


def make_pki(where: Path) -> Pki:
    ca = trustme.CA(organization_name="tqbroker tests")
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    server = ca.issue_cert(HOST, "localhost")
    server.cert_chain_pems[0].write_to_path(str(where / "cert.pem"))
    server.private_key_pem.write_to_path(str(where / "key.pem"))
    ca.issue_cert(
        "alice.example", common_name="alice"
    ).private_key_and_cert_chain_pem.write_to_path(str(where / "client.pem"))
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    ca.issue_cert(
        "alice.example", common_name="alice", not_after=past
    ).private_key_and_cert_chain_pem.write_to_path(str(where / "expired.pem"))
    trustme.CA().issue_cert(
        "alice.example", common_name="alice"
    ).private_key_and_cert_chain_pem.write_to_path(str(where / "untrusted.pem"))
    return Pki(
        where / "ca.pem",
        where / "cert.pem",
        where / "key.pem",
        where / "client.pem",
        where / "expired.pem",
        where / "untrusted.pem",
    )


def tls_config(pki: Pki, **options: object) -> TlsConfig:
    return TlsConfig(
        port=0,
        certfile=pki.cert,
        keyfile=pki.key,
        cacertfile=pki.ca,
        **options,  # type: ignore[arg-type]
    )


def client_context(pki: Pki, cert: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert))
    return context


@contextmanager
def tls_broker(tls: TlsConfig, **settings: object) -> Iterator[Listening]:
    """A broker on 127.0.0.1 (ephemeral ports, a temporary data directory) with ``tls``, in a
    thread (``tqbroker.testing.running_broker``): where it listens, amqps included."""
    config = BrokerConfig(port=0, tls=tls, **settings)  # type: ignore[arg-type]
    with running_broker(config) as running:
        assert running.listening is not None
        yield running.listening
