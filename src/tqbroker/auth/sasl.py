"""SASL for ``connection.start-ok``: PLAIN and AMQPLAIN responses parsed, EXTERNAL (the user
named by the verified TLS client certificate; the response is ignored), never ANONYMOUS.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..protocol.codec import U32, read_table
from ..protocol.errors import DecodeError

MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")
# RabbitMQ's auth_mechanisms default.
DEFAULT_MECHANISMS = ("PLAIN", "AMQPLAIN")


def offered_mechanisms(configured: Iterable[str], has_certificate_user: bool) -> list[str]:
    """The mechanisms ``connection.start`` offers: the configured ones (RabbitMQ's
    ``auth_mechanisms``) that tqbroker knows, EXTERNAL only when the connection has a verified
    client certificate that names a user."""
    return [m for m in configured if m in MECHANISMS and (m != "EXTERNAL" or has_certificate_user)]


def parse_response(mechanism: str, response: bytes) -> tuple[str, str]:
    """``(username, password)`` from a PLAIN or AMQPLAIN start-ok response, valid Unicode text;
    ValueError if it does not parse. (EXTERNAL's response is ignored: the user is the
    certificate's.)"""
    if mechanism == "PLAIN":
        parts = response.split(b"\0")
        if len(parts) != 3:
            raise ValueError("PLAIN response is not authzid NUL authcid NUL passwd")
        return parts[1].decode(), parts[2].decode()
    if mechanism == "AMQPLAIN":
        try:
            table, _ = read_table(memoryview(U32.pack(len(response)) + response), 0)
        except DecodeError as exc:
            raise ValueError(f"AMQPLAIN response is not a field table: {exc}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, str) or not isinstance(password, str):
            raise ValueError("AMQPLAIN response lacks LOGIN or PASSWORD")
        # Table strings keep bytes that are not UTF-8 (surrogateescape); credentials are text.
        for text in (login, password):
            try:
                text.encode()
            except UnicodeEncodeError:
                raise ValueError("AMQPLAIN LOGIN or PASSWORD is not valid UTF-8") from None
        return login, password
    raise ValueError(f"unknown mechanism {mechanism!r}")
