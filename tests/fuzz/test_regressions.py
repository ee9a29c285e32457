"""The bugs the fuzzers found, each pinned: the input the fuzzer made, at the unit it broke, and
through a real client over loopback where a client can send it.
"""

from __future__ import annotations

import struct

import pytest

from rawamqp import RawAMQP
from tqbroker.auth import parse_response
from tqbroker.protocol.frames import PROTOCOL_HEADER
from tqbroker.protocol.methods import ConnectionStart, ConnectionStartOk
from tqbroker.testing import RunningBroker


def _longstr_entry(name: bytes, raw: bytes) -> bytes:
    return bytes((len(name),)) + name + b"S" + struct.pack(">I", len(raw)) + raw


# An AMQPLAIN response (a field table without its length) whose PASSWORD is not UTF-8: the
# fuzzer's ``\x01\x05LOGINS...\x08PASSWORDS\x00\x00\x00\x05gu\x94st``.
BAD_AMQPLAIN = _longstr_entry(b"LOGIN", b"guest") + _longstr_entry(b"PASSWORD", b"gu\x94st")


def test_amqplain_credentials_must_be_utf8() -> None:
    """Field-table strings keep invalid UTF-8 (``surrogateescape``), which
    ``UserStore.verify`` cannot encode: the response is refused as not parsing."""
    with pytest.raises(ValueError, match="UTF-8"):
        parse_response("AMQPLAIN", BAD_AMQPLAIN)
    bad_login = _longstr_entry(b"LOGIN", b"\xff") + _longstr_entry(b"PASSWORD", b"guest")
    with pytest.raises(ValueError, match="UTF-8"):
        parse_response("AMQPLAIN", bad_login)


def test_amqplain_bad_utf8_refused_with_403(tqbroker_thread: RunningBroker) -> None:
    """Over a socket: connection.close 403 ACCESS_REFUSED, as for any bad response, not an
    internal error (the exception used to escape the handshake from the worker thread)."""
    with RawAMQP(tqbroker_thread.host, tqbroker_thread.port) as conn:
        conn.send(PROTOCOL_HEADER)
        conn.expect_method(ConnectionStart)
        response = BAD_AMQPLAIN.decode("utf-8", "surrogateescape")
        capabilities = {"capabilities": {"authentication_failure_close": True}}
        conn.send_method(0, ConnectionStartOk(capabilities, "AMQPLAIN", response, "en_US"))
        close = conn.expect_connection_close(403)
        assert "UTF-8" in close.reply_text
