"""``username_from_certificate`` and RabbitMQ's DN string (``certinfo.py``): against real trustme
certificates (decoded by the ``ssl`` module as a connection would), against ``openssl x509
-nameopt RFC2253`` (the format rabbit_cert_info follows), and as properties of any subject."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st

from tqbroker.server.certinfo import (
    distinguished_name,
    suite,
    username_from_certificate,
    validity,
)


def decoded(tmp_path: Path, leaf: trustme.LeafCert) -> dict[str, Any]:
    path = tmp_path / "leaf.pem"
    leaf.cert_chain_pems[0].write_to_path(str(path))
    return ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA(organization_name="Example, Inc.")


def test_each_login_source(tmp_path: Path, ca: trustme.CA) -> None:
    leaf = ca.issue_cert(
        "alice.example",
        "127.0.0.1",
        "alice@example.com",
        "bob.example",
        common_name="alice",
        organization_name="Ex+ample é",
    )
    cert = decoded(tmp_path, leaf)
    assert username_from_certificate(cert) == "alice"  # common_name, the default
    dn = username_from_certificate(cert, "distinguished_name")
    assert dn is not None
    assert dn.startswith("CN=alice,OU=Testing cert #")
    assert dn.endswith(",O=Ex\\+ample \\C3\\A9")
    san = "subject_alternative_name"
    assert username_from_certificate(cert, san) == "alice.example"  # dns, index 0
    assert username_from_certificate(cert, san, "dns", 1) == "bob.example"
    assert username_from_certificate(cert, san, "dns", 2) is None
    assert username_from_certificate(cert, san, "ip", 0) == "127.0.0.1"
    assert username_from_certificate(cert, san, "email", 0) == "alice@example.com"
    assert username_from_certificate(cert, san, "uri", 0) is None
    assert username_from_certificate(cert, san, "other_name", 0) is None
    assert username_from_certificate(None) is None
    assert username_from_certificate({}) is None
    with pytest.raises(ValueError, match="unknown source"):
        username_from_certificate(cert, "serial")


def test_no_common_name(tmp_path: Path, ca: trustme.CA) -> None:
    cert = decoded(tmp_path, ca.issue_cert("only-a-san.example"))
    assert username_from_certificate(cert) is None
    assert username_from_certificate(cert, "subject_alternative_name") == "only-a-san.example"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl (Debian: openssl)")
@pytest.mark.parametrize(
    "organization", ["plain", "Example, Inc.", ' #lead "q" <a>;b\\c ', "ünïcode €", "x=y+z"]
)
def test_same_as_openssl_rfc2253(tmp_path: Path, ca: trustme.CA, organization: str) -> None:
    leaf = ca.issue_cert("a.example", common_name="svc", organization_name=organization)
    cert = decoded(tmp_path, leaf)
    shown = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "leaf.pem", "-noout", "-subject", *RFC2253],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert distinguished_name(cert["subject"]) == shown.rstrip("\n").removeprefix("subject=")


RFC2253 = ("-nameopt", "RFC2253")


def test_validity_in_rabbitmq_form() -> None:
    cert = {"notBefore": "Jan  1 00:00:00 2000 GMT", "notAfter": "Feb 29 23:59:59 2040 GMT"}
    assert validity(cert) == "2000-01-01T00:00:00Z - 2040-02-29T23:59:59Z"
    assert validity({}) is None


@pytest.mark.parametrize(
    ("name", "erlang"),
    [
        # RabbitMQ 3.10.8 (loopback oracle) shows a TLS 1.3 connection as any/aes_256_gcm/aead.
        ("TLS_AES_256_GCM_SHA384", ("any", "aes_256_gcm", "aead")),
        ("TLS_CHACHA20_POLY1305_SHA256", ("any", "chacha20_poly1305", "aead")),
        ("ECDHE-ECDSA-AES128-GCM-SHA256", ("ecdhe_ecdsa", "aes_128_gcm", "aead")),
        ("ECDHE-RSA-AES256-SHA384", ("ecdhe_rsa", "aes_256_cbc", "sha384")),
        ("DHE-RSA-AES256-SHA256", ("dhe_rsa", "aes_256_cbc", "sha256")),
        ("AES128-SHA", ("rsa", "aes_128_cbc", "sha")),
        ("NOT-A-SUITE", (None, "NOT-A-SUITE", None)),
    ],
)
def test_cipher_suites_in_erlang_words(name: str, erlang: tuple[str | None, ...]) -> None:
    assert suite(name) == erlang


def _unescape(text: str) -> str:
    """RFC 4514's unescaping of one value (hex pairs are UTF-8 bytes)."""
    out, index = bytearray(), 0
    while index < len(text):
        char = text[index]
        if char == "\\" and text[index + 1 : index + 3].isalnum() and len(text) > index + 2:
            pair = text[index + 1 : index + 3]
            if all(c in "0123456789ABCDEF" for c in pair):
                out.append(int(pair, 16))
                index += 3
                continue
        if char == "\\":
            out += text[index + 1].encode()
            index += 2
            continue
        out += char.encode()
        index += 1
    return out.decode("utf-8")


VALUES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)


@given(cn=VALUES, org=VALUES)
def test_dn_is_printable_and_reversible(cn: str, org: str) -> None:
    subject = ((("organizationName", org),), (("commonName", cn),))
    dn = distinguished_name(subject)
    assert all(32 <= ord(c) < 126 for c in dn), dn
    first, second = _split(dn)
    assert first.startswith("CN=")
    assert second.startswith("O=")
    assert _unescape(first[3:]) == cn
    assert _unescape(second[2:]) == org
    assert username_from_certificate({"subject": subject}) == cn


def _split(dn: str) -> list[str]:
    """The RDNs of ``dn``: split at the commas that are not escaped."""
    parts, current, escaped = [], "", False
    for char in dn:
        if char == "," and not escaped:
            parts.append(current)
            current = ""
            continue
        escaped = char == "\\" and not escaped
        current += char
    return [*parts, current]
