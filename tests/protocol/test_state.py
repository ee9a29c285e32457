"""The state tables: what the server may send in each connection and channel state (anything
else is a ``LocalProtocolError``), and per-connection caches."""

from __future__ import annotations

import pytest

from tqbroker.protocol import methods as m
from tqbroker.protocol import properties
from tqbroker.protocol._state import (
    CHANNEL_RECEIVE_TRANSITIONS,
    CHANNEL_SEND_TRANSITIONS,
    RECEIVE_TRANSITIONS,
    SEND_TRANSITIONS,
    ChannelState,
)
from tqbroker.protocol.connection import (
    LocalProtocolError,
    MethodReceived,
    ServerConnection,
    State,
)
from tqbroker.protocol.errors import AMQPError, ReplyCode
from tqbroker.protocol.frames import encode_method, write_content

from .test_connection import START, open_server


def test_the_tables_name_only_methods_of_their_class() -> None:
    for _, method in RECEIVE_TRANSITIONS | SEND_TRANSITIONS:
        assert method.CLASS_ID == m.CONNECTION_CLASS_ID
    for _, method in CHANNEL_RECEIVE_TRANSITIONS | CHANNEL_SEND_TRANSITIONS:
        assert method.CLASS_ID == m.CHANNEL_CLASS_ID


def test_connection_close_may_be_sent_in_any_state() -> None:
    for state in State:
        conn = ServerConnection()
        conn.state = state
        conn.close_connection(AMQPError(ReplyCode.CONNECTION_FORCED, "bye"))
        assert conn.state is State.CLOSING


@pytest.mark.parametrize(
    "method",
    [START, m.ConnectionTune(16, 8192, 30), m.ConnectionOpenOk(), m.ConnectionCloseOk()],
)
def test_a_handshake_method_out_of_turn_is_a_local_error(method: m.Method) -> None:
    server = open_server()
    with pytest.raises(LocalProtocolError, match=method.NAME):
        server.conn.send_method(0, method)
    assert server.conn.state is State.OPEN


def test_start_is_sent_once() -> None:
    conn = ServerConnection()
    with pytest.raises(LocalProtocolError):
        conn.send_method(0, START)  # no protocol header yet
    conn.receive_data(b"AMQP\x00\x00\x09\x01")
    conn.next_event()
    conn.send_method(0, START)
    with pytest.raises(LocalProtocolError):
        conn.send_method(0, START)
    assert conn.state is State.AWAIT_START_OK


def test_methods_on_the_wrong_channel_are_local_errors() -> None:
    server = open_server(1)
    with pytest.raises(LocalProtocolError):
        server.conn.send_method(0, m.BasicAck(1))
    with pytest.raises(LocalProtocolError):
        server.conn.send_method(1, m.ConnectionCloseOk())
    assert server.conn.state is State.OPEN
    assert server.conn.channel_is_open(1)


def test_channel_sends_follow_the_channel_table() -> None:
    server = open_server(1)
    conn = server.conn
    conn.send_method(1, m.ChannelOpenOk())
    with pytest.raises(LocalProtocolError):
        conn.send_method(2, m.ChannelOpenOk())  # never opened
    with pytest.raises(LocalProtocolError):
        conn.send_method(2, m.ChannelCloseOk())  # nothing to close
    conn.send_method(2, m.ChannelClose(200, "ok"))  # the peer's close-ok crossed ours: no-op
    assert 2 not in conn.channels
    conn.send_method(1, m.ChannelClose(200, "ok"))
    assert conn.channels[1].state is ChannelState.CLOSING
    with pytest.raises(LocalProtocolError):
        conn.send_method(1, m.ChannelOpenOk())
    conn.send_method(1, m.BasicAck(1))  # a confirm racing the close is not refused
    conn.receive_data(encode_method(1, m.ChannelCloseOk()))
    assert conn.next_event() == MethodReceived(1, m.ChannelCloseOk())
    assert 1 not in conn.channels


def test_each_connection_has_its_own_publish_cache() -> None:
    first, second = open_server(1), open_server(1)
    out = bytearray(encode_method(1, m.BasicPublish(0, "ex", "key")))
    write_content(out, 1, b"\x00\x00", b"body", 4096)
    [event] = first.feed(bytes(out))
    assert len(first.conn._fastpath._publishes) == 1
    assert second.conn._fastpath._publishes == {}
    [again] = second.feed(bytes(out))
    assert again == event
    assert again.method is not event.method


def test_the_property_plans_list_the_widths_of_the_flags() -> None:
    widths = {"octet": 1, "timestamp": 8, "shortstr": 0}
    for flags, plan in properties._PLANS.items():
        assert not flags & properties._DECODE_FLAGS
        assert plan == tuple(
            widths[kind] for _name, flag, kind in m.PROPERTY_LAYOUT if flags & flag
        )
    assert len(properties._PLANS) == 1 << 12  # 11 plain properties and the unused bit 1
