"""The SCRAM server (``tqbroker.auth.scram``) against an independent client: kafka-python's
``ScramClient`` (``kafka/net/sasl/scram.py``, what kafka-python logs in to Kafka with), for
any user name, password and mechanism: the right password logs in and the client accepts the
server's signature; any other password is refused; RFC 7677's test vector; Kafka's SASLname
escaping (``ScramFormatter.username``), authzid, ``tokenauth`` and broken messages refused.
Credentials round-trip through their JSON."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.scram import ScramClient

from tqbroker.auth.internal import parse_user, user_json
from tqbroker.auth.model import User
from tqbroker.auth.scram import (
    HASHES,
    ScramError,
    ScramServer,
    credential_for,
    parse_credentials,
    saslname_of,
)

# Few iterations in the property tests (the server takes the stored count as it is).
FAST = 16
names = st.text(st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=20)
passwords = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
mechanisms = st.sampled_from(sorted(HASHES))


def _exchange(mechanism: str, stored_password: str, client_password: str, name: str) -> bytes:
    """A whole login: the server-final message, or ScramError."""
    client = ScramClient(name, client_password, mechanism)
    client.user = saslname_of(name).encode()  # kafka-python sends the name unescaped
    server = ScramServer(mechanism)
    first = server.receive_client_first(client.first_message())
    assert first.username == name
    credential = credential_for(mechanism, stored_password, iterations=FAST)
    client.process_server_first_message(server.server_first(credential))
    final = server.receive_client_final(client.final_message())
    client.process_server_final_message(final)  # ValueError if the signature is wrong
    assert server.done
    return final


@settings(max_examples=60, deadline=None)
@given(mechanisms, names, passwords)
def test_the_right_password_logs_in(mechanism: str, name: str, password: str) -> None:
    assert _exchange(mechanism, password, password, name).startswith(b"v=")


@settings(max_examples=60, deadline=None)
@given(mechanisms, names, passwords, passwords)
def test_another_password_is_refused(mechanism: str, name: str, stored: str, sent: str) -> None:
    if stored == sent:
        return
    with pytest.raises(ScramError, match="invalid credentials"):
        _exchange(mechanism, stored, sent, name)


def test_rfc7677_vector() -> None:
    """RFC 7677 section 3's SCRAM-SHA-256 exchange, byte for byte."""
    server = ScramServer("SCRAM-SHA-256", nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server.receive_client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    first = server.server_first(credential_for("SCRAM-SHA-256", "pencil", salt, 4096))
    assert first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = server.receive_client_final(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.mark.parametrize(
    ("message", "username"),
    [
        (b"n,,n=a=2Cb=3Dc,r=x", "a,b=c"),  # ScramFormatter.username
        (b"n,a=bob,n=bob,r=x", "bob"),  # an authzid equal to the user (ScramSaslServer)
        (b"n,,n=bob,r=x,ext=1", "bob"),  # an unknown extension is ignored
    ],
)
def test_client_first_messages(message: bytes, username: str) -> None:
    assert ScramServer("SCRAM-SHA-512").receive_client_first(message).username == username


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"y,,n=bob,r=x", "invalid"),  # channel binding: Kafka's clients send n
        (b"p=tls-unique,,n=bob,r=x", "invalid"),
        (b"n,,n=b=2Xob,r=x", "invalid"),  # a bad escape (ScramFormatter.username)
        (b"n,a=eve,n=bob,r=x", "authorization id"),
        (b"n,,n=bob,r=x,tokenauth=true", "delegation tokens"),
        (b"n,,n=\xff,r=x", "UTF-8"),
        (b"", "invalid"),
    ],
)
def test_client_first_refusals(message: bytes, why: str) -> None:
    with pytest.raises(ScramError, match=why):
        ScramServer("SCRAM-SHA-256").receive_client_first(message)


def test_client_final_refusals() -> None:
    def started() -> tuple[ScramServer, str]:
        server = ScramServer("SCRAM-SHA-256", nonce="S")
        server.receive_client_first(b"n,,n=bob,r=C")
        server.server_first(credential_for("SCRAM-SHA-256", "pw", iterations=FAST))
        return server, base64.b64encode(b"\0" * 32).decode()

    for final, why in [
        (b"c=biws,r=CX,p=%s", "nonce"),
        (b"c=biws,r=CSX,p=%s", "nonce"),
        (b"c=eSws,r=CS,p=%s", "channel binding"),
        (b"c=biws,r=CS,p=%s", "invalid credentials"),
        (b"c=biws,r=CS", "invalid SCRAM client-final"),
    ]:
        server, proof = started()
        message = final.replace(b"%s", proof.encode())
        with pytest.raises(ScramError, match=why):
            server.receive_client_final(message)
        with pytest.raises(ScramError, match="unexpected"):  # a failed exchange stays failed
            server.receive_client_final(message)


def test_credentials_round_trip_through_a_users_entry() -> None:
    user = User.with_password("alice", "secret", ["monitoring"])
    assert {c.mechanism for c in user.scram} == set(HASHES)
    assert all(c.iterations == 4096 for c in user.scram)
    entry = user_json(user, with_hash=True, with_scram=True)
    assert parse_user(entry) == user
    assert "scram_credentials" not in user_json(user, with_hash=True)  # /api/users
    without = parse_user({k: v for k, v in entry.items() if k != "scram_credentials"})
    assert without.scram == ()
    assert without.password_hash == user.password_hash
    plain = parse_user({"name": "bob", "password": "pw", "tags": []})  # RabbitMQ's import
    assert plain.scram_credential("SCRAM-SHA-512") is not None
    with pytest.raises(ValueError, match="SCRAM-SHA-1"):
        parse_credentials({"SCRAM-SHA-1": {}})
