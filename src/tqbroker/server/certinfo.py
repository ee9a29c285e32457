"""What a client certificate says, sans-IO: from the dict ``ssl.SSLSocket.getpeercert()`` (and
``trio.SSLStream.getpeercert()``) returns.

- ``username_from_certificate``: EXTERNAL's user, as RabbitMQ's ``rabbitmq_auth_mechanism_ssl``
  finds it (``ssl_cert_login_from``: ``common_name``, ``distinguished_name``, or
  ``subject_alternative_name`` with ``ssl_cert_login_san_type`` and ``ssl_cert_login_san_index``);
- ``distinguished_name``: a subject or issuer as RabbitMQ formats it (``rabbit_cert_info``: RFC
  4514, the last RDN first, ``CN=client,O=example``);
- ``validity``: RabbitMQ's ``peer_cert_validity`` (``2026-01-01T00:00:00Z - 2027-...``);
- ``connection_fields``: the management API's TLS fields of a connection, the cipher suite in
  Erlang's words as RabbitMQ shows it (``aes_256_gcm``, ``aead``, ``ecdhe_rsa``; ``any`` for
  TLS 1.3's key exchange), from OpenSSL's description of the suite.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any

# OpenSSL's long names (what getpeercert gives) -> RabbitMQ's short ones (rabbit_cert_info).
SHORT_NAMES = {
    "surname": "SN",
    "givenName": "GIVENNAME",
    "initials": "INITIALS",
    "generationQualifier": "GENERATIONQUALIFIER",
    "commonName": "CN",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "title": "TITLE",
    "countryName": "C",
    "serialNumber": "SERIALNUMBER",
    "pseudonym": "PSEUDONYM",
    "domainComponent": "DC",
    "emailAddress": "EMAILADDRESS",
    "streetAddress": "STREET",
    "userId": "UID",
}
# ssl_cert_login_san_type -> getpeercert's subjectAltName kinds.
SAN_KINDS = {
    "dns": "DNS",
    "ip": "IP Address",
    "email": "email",
    "uri": "URI",
    "other_name": "othername",
}
_SPECIAL = '"+,;<>\\'

Certificate = Mapping[str, Any]


def username_from_certificate(
    cert: Certificate | None,
    login_from: str = "common_name",
    san_type: str = "dns",
    san_index: int = 0,
) -> str | None:
    """The user a verified client certificate names, or None (no certificate, nothing of the
    kind asked for, or an other_name SAN, which Python's ``ssl`` does not decode)."""
    if not cert:
        return None
    if login_from == "common_name":
        # Several CNs: joined with "," as RabbitMQ does (unescaped; use the DN for that).
        names = [value for name, value in _attributes(cert.get("subject", ())) if name == "CN"]
        return ",".join(names) if names else None
    if login_from == "distinguished_name":
        return distinguished_name(cert.get("subject", ())) or None
    if login_from == "subject_alternative_name":
        kind = SAN_KINDS.get(san_type)
        found = [value for key, value in cert.get("subjectAltName", ()) if key == kind]
        if kind == "othername" or not 0 <= san_index < len(found):
            return None
        return str(found[san_index])
    raise ValueError(f"ssl_cert_login_from: unknown source {login_from!r}")


def distinguished_name(rdns: Sequence[Sequence[tuple[str, str]]]) -> str:
    """RabbitMQ's string of a subject or issuer (the RDNs as getpeercert gives them)."""
    formatted = []
    for rdn in rdns:
        formatted.append(
            "+".join(f"{SHORT_NAMES.get(key, key)}={_escape(value)}" for key, value in rdn)
        )
    return ",".join(reversed(formatted))


def validity(cert: Certificate) -> str | None:
    """``notBefore - notAfter`` in RabbitMQ's form (ISO 8601, UTC)."""
    try:
        start, end = (ssl.cert_time_to_seconds(cert[key]) for key in ("notBefore", "notAfter"))
    except (KeyError, ValueError, TypeError):
        return None
    return f"{_iso(start)} - {_iso(end)}"


def _iso(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _attributes(rdns: Sequence[Sequence[tuple[str, str]]]) -> list[tuple[str, str]]:
    return [(SHORT_NAMES.get(key, key), value) for rdn in rdns for key, value in rdn]


def _escape(value: str) -> str:
    """RFC 4514 escaping as RabbitMQ does it: a leading space or ``#``, a trailing space, the
    special characters; bytes outside printable ASCII as ``\\XX`` (of their UTF-8)."""
    out = []
    data = value.encode("utf-8")
    for index, byte in enumerate(data):
        char = chr(byte)
        if index == 0 and char in " #":
            out.append("\\" + char)
        elif char == " " and index == len(data) - 1:
            out.append("\\ ")
        elif char in _SPECIAL:
            out.append("\\" + char)
        elif byte < 32 or byte >= 126:
            out.append(f"\\{byte:02X}")
        else:
            out.append(char)
    return "".join(out)


def connection_fields(
    version: str | None, cipher: tuple[str, str, int] | None, cert: Certificate | None
) -> dict[str, Any]:
    """The management API's TLS fields of a connection (RabbitMQ's names): ``version`` and
    ``cipher`` as ``SSLObject.version()`` and ``.cipher()`` give them, the verified client
    certificate (None for a plaintext connection)."""
    key_exchange, symmetric, mac = suite(cipher[0]) if cipher else (None, None, None)
    return {
        "ssl": version is not None,
        "ssl_protocol": version.lower() if version else None,
        "ssl_key_exchange": key_exchange,
        "ssl_cipher": symmetric,
        "ssl_hash": mac,
        "peer_cert_subject": distinguished_name(cert.get("subject", ())) if cert else None,
        "peer_cert_issuer": distinguished_name(cert.get("issuer", ())) if cert else None,
        "peer_cert_validity": validity(cert) if cert else None,
    }


def suite(name: str) -> tuple[str | None, str | None, str | None]:
    """OpenSSL's cipher suite ``name`` as Erlang's key exchange, cipher and MAC (RabbitMQ's
    ``ssl_key_exchange``, ``ssl_cipher``, ``ssl_hash``); OpenSSL's name as the cipher if the
    suite is not one the ``ssl`` module's defaults describe."""
    found = _suites().get(name)
    if found is None:
        return None, name, None
    kea = str(found["kea"]).removeprefix("kx-")
    auth = str(found["auth"]).removeprefix("auth-")
    key_exchange = kea if kea in ("any", "rsa", "psk") else f"{kea}_{auth}"
    mac = "aead" if found["aead"] else {"sha1": "sha"}.get(found["digest"], found["digest"])
    return key_exchange, str(found["symmetric"]).replace("-", "_"), mac


@functools.cache
def _suites() -> dict[str, Any]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers("ALL")
    return {found["name"]: found for found in context.get_ciphers()}
