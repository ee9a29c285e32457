"""SASL on the Kafka listener: SaslHandshake (the mechanism), then the mechanism's tokens: in
SaslAuthenticate requests after a version 1 handshake (KIP-152), or after a version 0 one as
bare size-prefixed frames answered by bare frames, as Kafka's ``SaslServerAuthenticator``
(``handleSaslToken``) takes them (librdkafka before 2.11.1, Debian's kcat among them, needs
version 0 served to log in at all: ``shared/reference/kafka.md`` §1.1).

- PLAIN (RFC 4616): one token, ``authzid NUL authcid NUL password``, logged in as an AMQP
  PLAIN login is (the broker's users and authentication backends);
- SCRAM-SHA-256 and SCRAM-SHA-512 (KIP-84; ``tqbroker.auth.scram``): two rounds, the
  client-first message answered with the server-first one, the client-final with the
  server-final; for the internal users whose password was set through tqbroker (they have
  SCRAM credentials).

A refusal is SASL_AUTHENTICATION_FAILED with the reason, and the connection closes after it
(``connection.py``), as Kafka's ``SaslServerAuthenticator`` does; after a version 0 handshake
there is no way to say why, so the connection just closes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...auth import Peer
from ...auth.authenticator import LoginRefused
from ...auth.scram import HASHES, ScramError, ScramServer
from ...protocol.kafka import errors
from .session import KafkaSession

PLAIN: Final = "PLAIN"
MECHANISMS: Final = [PLAIN, *HASHES]


async def sasl_handshake(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    mechanism = body["mechanism"]
    if session.user is not None or session.mechanism is not None:
        return {"error_code": errors.ILLEGAL_SASL_STATE, "mechanisms": MECHANISMS}
    if mechanism not in MECHANISMS:
        return {"error_code": errors.UNSUPPORTED_SASL_MECHANISM, "mechanisms": MECHANISMS}
    session.mechanism = mechanism
    session.unframed_tokens = version == 0
    if mechanism != PLAIN:
        session.scram = ScramServer(mechanism)
    return {"error_code": errors.NONE, "mechanisms": MECHANISMS}


async def sasl_authenticate(
    session: KafkaSession, body: Mapping[str, Any], version: int
) -> dict[str, Any]:
    """One token of the handshake's mechanism; a refusal is SASL_AUTHENTICATION_FAILED."""
    if session.mechanism is None or session.user is not None:
        return _answer(errors.ILLEGAL_SASL_STATE, "no SASL handshake before")
    if session.scram is not None:
        return await _scram(session, session.scram, body["auth_bytes"])
    parts = body["auth_bytes"].split(b"\0")
    if len(parts) != 3:
        return _answer(errors.SASL_AUTHENTICATION_FAILED, "not a PLAIN response")
    try:
        username, password = parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        return _answer(errors.SASL_AUTHENTICATION_FAILED, "not UTF-8")
    refused = await session.log_in(username, password)
    if refused is not None:
        return _answer(errors.SASL_AUTHENTICATION_FAILED, refused)
    session.mechanism = None
    return _answer(errors.NONE, None)


async def unframed_token(session: KafkaSession, token: bytes) -> bytes | None:
    """A token after a version 0 handshake: the server's token, size-prefixed (empty for
    PLAIN, as Kafka's ``PlainSaslServer`` answers), or None when the login is refused."""
    answer = await sasl_authenticate(session, {"auth_bytes": token}, 0)
    if answer["error_code"] != errors.NONE:
        return None
    if session.mechanism is None:  # logged in: requests again
        session.unframed_tokens = False
    reply: bytes = answer["auth_bytes"]
    return len(reply).to_bytes(4, "big") + reply


async def _scram(session: KafkaSession, server: ScramServer, token: bytes) -> dict[str, Any]:
    authenticator = session.broker.authenticator
    peer = Peer(session.peer[0], session.peer[1])
    try:
        if server.username is None:
            first = server.receive_client_first(token)
            user, credential = await authenticator.scram_credential(
                first.username, server.mechanism, peer
            )
            session.scram_user = user
            return _answer(errors.NONE, None, server.server_first(credential))
        assert session.scram_user is not None
        try:
            final = server.receive_client_final(token)
        except ScramError:
            await authenticator.scram_login(session.scram_user, False, peer)
            raise
        user = await authenticator.scram_login(session.scram_user, True, peer)
    except (ScramError, LoginRefused) as exc:
        return _answer(errors.SASL_AUTHENTICATION_FAILED, f"{server.mechanism}: {exc}")
    refused = await session.admit(user)
    if refused is not None:
        return _answer(errors.SASL_AUTHENTICATION_FAILED, refused)
    session.mechanism = session.scram = session.scram_user = None
    return _answer(errors.NONE, None, final)


def _answer(code: int, message: str | None, token: bytes = b"") -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message,
        "auth_bytes": token,
        "session_lifetime_ms": 0,
    }
