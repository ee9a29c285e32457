"""The HTTP auth backend (plugins/auth_http) against an HTTPS service with throwaway CAs
(trustme): ``ssl_options`` gives the service's CA and a client certificate; a service whose
certificate is not trusted, or that wants a client certificate, refuses without one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from tqbroker_auth_http import HttpAuthBackend

from tqbroker.auth import AuthConfigError, load_chain
from tqbroker.plugins import AuthBackendError, Peer

from .http_auth_service import AuthService, ServiceTls, running_service

trustme = pytest.importorskip("trustme", reason="trustme (a test dependency) makes the CAs")

pytestmark = pytest.mark.timeout(30)

PEER = Peer("127.0.0.1")


def write(tmp_path: Path, name: str, pem: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(pem)
    return str(path)


def backend(service: AuthService, **options: object) -> HttpAuthBackend:
    found = load_chain(["http"], {"http": service.options(**options)}).backends["http"]
    assert isinstance(found, HttpAuthBackend)
    return found


@attrs.frozen
class Https:
    """A running HTTPS auth service and the files of the broker's side."""

    service: AuthService
    ca_file: str  # the CA of the service's certificate
    client_cert: str  # a certificate (and its key) the service accepts


@pytest.fixture
def https(tmp_path: Path) -> Iterator[Https]:
    """An HTTPS service on 127.0.0.1 that requires a client certificate of its own CA."""
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1")
    client = client_ca.issue_cert("tqbroker")
    tls = ServiceTls(
        certfile=write(tmp_path, "server.pem", b"".join(b.bytes() for b in server.cert_chain_pems)),
        keyfile=write(tmp_path, "server.key", server.private_key_pem.bytes()),
        client_ca=write(tmp_path, "client-ca.pem", client_ca.cert_pem.bytes()),
    )
    service = AuthService(users={"alice": ("pw", "allow management")})
    with running_service(service, tls):
        yield Https(
            service,
            write(tmp_path, "ca.pem", server_ca.cert_pem.bytes()),
            write(tmp_path, "client.pem", client.private_key_and_cert_chain_pem.bytes()),
        )


async def test_https_with_the_services_ca_and_a_client_certificate(https: Https) -> None:
    service = https.service
    assert service.url.startswith("https://")
    mutual = {"cacertfile": https.ca_file, "certfile": https.client_cert}
    user = await backend(service, ssl_options=mutual).authenticate("alice", "pw", PEER)
    assert user is not None
    assert user.tags == {"management"}
    assert service.count("user") == 1


async def test_an_untrusted_service_is_no_answer(https: Https) -> None:
    untrusted = backend(https.service, ssl_options={"certfile": https.client_cert})
    with pytest.raises(AuthBackendError, match="CERTIFICATE_VERIFY_FAILED"):
        await untrusted.authenticate("alice", "pw", PEER)
    assert https.service.count("user") == 0


async def test_a_service_that_wants_a_client_certificate_refuses_without(https: Https) -> None:
    anonymous = backend(https.service, ssl_options={"cacertfile": https.ca_file})
    with pytest.raises(AuthBackendError, match=r"HTTP auth service https://127\.0\.0\.1"):
        await anonymous.authenticate("alice", "pw", PEER)
    assert https.service.count("user") == 0


@pytest.mark.parametrize(
    ("ssl_options", "problem"),
    [
        ({"cacertfile": "/nonexistent/ca.pem"}, "ssl_options: .*No such file"),
        ({"verify": "verify_none"}, "ssl_options must be a table of cacertfile, certfile"),
        ({"keyfile": "k.pem"}, "ssl_options.keyfile needs ssl_options.certfile"),
        ("ca.pem", "ssl_options must be a table"),
    ],
)
def test_bad_ssl_options_are_a_clear_startup_error(ssl_options: object, problem: str) -> None:
    paths = {
        f"{k}_path": f"https://127.0.0.1:1/auth/{k}" for k in ("user", "vhost", "resource", "topic")
    }
    with pytest.raises(AuthConfigError, match=problem):
        load_chain(["http"], {"http": {**paths, "ssl_options": ssl_options}})
