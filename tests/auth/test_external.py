"""SASL EXTERNAL through the AMQP handshake (the TLS listener will give the handshake the user
its verified client certificate names, ``peer_username``): offered only then, the user must
exist (it may have no password), and the response is ignored. Driven on a real ``Broker``'s
handshake, before the TLS listener exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tqbroker.auth import User
from tqbroker.broker.broker import Broker
from tqbroker.config import BrokerConfig
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.errors import AMQPError
from tqbroker.protocol.methods import ConnectionStart, ConnectionStartOk, ConnectionTune, Method
from tqbroker.server.handshake import Handshake, HangUp

EXTERNAL = ("PLAIN", "AMQPLAIN", "EXTERNAL")


def _handshake(tmp_path: Path, peer_username: str | None) -> tuple[Handshake, list[Method]]:
    broker = Broker(
        BrokerConfig(data_dir=tmp_path, auth_mechanisms=EXTERNAL, auth_failure_delay=0.0)
    )
    broker.users.put_user(User("cert-user"))  # no password: EXTERNAL only
    sent: list[Method] = []
    handshake = Handshake(
        broker, "127.0.0.1:1", "127.0.0.1", sent.append, "", peer_username=peer_username
    )
    handshake.start()
    return handshake, sent


def test_external_is_offered_with_a_certificate_user_only(tmp_path: Path) -> None:
    for peer_username, offered in ((None, "PLAIN AMQPLAIN"), ("x", "PLAIN AMQPLAIN EXTERNAL")):
        _, sent = _handshake(tmp_path, peer_username)
        assert isinstance(sent[0], ConnectionStart)
        assert sent[0].mechanisms == offered


async def test_external_logs_in_the_certificates_user(tmp_path: Path) -> None:
    handshake, sent = _handshake(tmp_path, "cert-user")
    await handshake.start_ok(ConnectionStartOk({}, "EXTERNAL", "ignored", "en_US"))
    assert isinstance(sent[-1], ConnectionTune)
    assert handshake.user is not None
    assert handshake.user.name == "cert-user"


async def test_external_needs_the_user_to_exist(tmp_path: Path) -> None:
    handshake, _ = _handshake(tmp_path, "stranger")
    capable: FieldTable = {"capabilities": {"authentication_failure_close": True}}
    with pytest.raises(AMQPError, match="authentication mechanism EXTERNAL"):
        await handshake.start_ok(ConnectionStartOk(capable, "EXTERNAL", "", "en_US"))


async def test_external_without_a_certificate_is_an_unknown_mechanism(tmp_path: Path) -> None:
    handshake, _ = _handshake(tmp_path, None)
    with pytest.raises(HangUp):
        await handshake.start_ok(ConnectionStartOk({}, "EXTERNAL", "", "en_US"))


async def test_a_user_without_a_password_cannot_use_plain(tmp_path: Path) -> None:
    handshake, _ = _handshake(tmp_path, None)
    with pytest.raises(HangUp):  # no authentication_failure_close capability: a hang-up
        await handshake.start_ok(ConnectionStartOk({}, "PLAIN", "\0cert-user\0", "en_US"))
