"""``ServerConnection``: the handshake, framing, content assembly and every protocol error."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tqbroker.protocol import methods as m
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.connection import (
    MAX_BODY_SIZE,
    NEED_DATA,
    BadProtocolHeader,
    ContentReceived,
    EndOfStream,
    Limits,
    MethodReceived,
    ProtocolHeaderReceived,
    ServerConnection,
    State,
)
from tqbroker.protocol.errors import AMQPError, ReplyCode
from tqbroker.protocol.frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    encode_method,
    write_content,
)
from tqbroker.protocol.methods import BasicProperties, decode_method

from .strategies import any_method, basic_properties, field_tables

LIMITS = Limits(channel_max=16, frame_max=8192, heartbeat=30, max_message_size=100_000)
CLIENT_PROPERTIES: FieldTable = {"product": "test", "capabilities": {"publisher_confirms": True}}
START = m.ConnectionStart(0, 9, {"product": "tqbroker"}, "PLAIN AMQPLAIN", "en_US")


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def content_header(body_size: int, properties: bytes = b"\x00\x00", class_id: int = 60) -> bytes:
    return struct.pack(">HHQ", class_id, 0, body_size) + properties


def publish(
    channel: int,
    body: bytes,
    properties: bytes = b"\x00\x00",
    frame_max: int = 4096,
    method: m.BasicPublish | None = None,
) -> bytes:
    out = bytearray(encode_method(channel, method or m.BasicPublish(0, "amq.direct", "rk")))
    write_content(out, channel, properties, body, frame_max)
    return bytes(out)


def client_handshake(channel_max: int = 16, frame_max: int = 8192, heartbeat: int = 30) -> bytes:
    return (
        PROTOCOL_HEADER
        + encode_method(0, m.ConnectionStartOk(CLIENT_PROPERTIES, "PLAIN", "\0guest\0guest", "en"))
        + encode_method(0, m.ConnectionTuneOk(channel_max, frame_max, heartbeat))
        + encode_method(0, m.ConnectionOpen("/"))
    )


def decode_frames(data: bytes) -> list[tuple[int, Any]]:
    """The method frames in ``data`` (what the server sent), decoded."""
    out = []
    pos = 0
    while pos < len(data):
        kind, channel, size = struct.unpack_from(">BHI", data, pos)
        assert kind == 1
        assert data[pos + 7 + size] == 0xCE
        out.append((channel, decode_method(memoryview(data)[pos + 7 : pos + 7 + size])))
        pos += 8 + size
    return out


class Server:
    """Plays the broker around a ``ServerConnection``: answers the handshake and closes."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self.conn = ServerConnection(limits)
        self.sent = bytearray()

    def send(self, channel: int, method: m.Method) -> None:
        self.sent += self.conn.send_method(channel, method)

    def feed(self, data: bytes) -> list[Any]:
        self.conn.receive_data(data)
        return self.pump()

    def pump(self) -> list[Any]:
        events = []
        while (event := self.conn.next_event()) is not NEED_DATA:
            events.append(event)
            self.react(event)
            if isinstance(event, EndOfStream):
                break
        return events

    def react(self, event: Any) -> None:
        if isinstance(event, ProtocolHeaderReceived):
            self.send(0, START)
        elif isinstance(event, MethodReceived):
            method = event.method
            if isinstance(method, m.ConnectionStartOk):
                limits = self.limits
                self.send(0, m.ConnectionTune(limits.channel_max, limits.frame_max, 30))
            elif isinstance(method, m.ConnectionOpen):
                self.send(0, m.ConnectionOpenOk())
            elif isinstance(method, m.ChannelClose):
                self.send(event.channel, m.ChannelCloseOk())
            elif isinstance(method, m.ConnectionClose):
                self.send(0, m.ConnectionCloseOk())

    def feed_tolerant(self, data: bytes) -> list[Any]:
        """Feed bytes the way the I/O layer does: a soft error closes its channel and reading
        goes on; a hard error (or a bad header) ends the connection."""
        self.conn.receive_data(data)
        events: list[Any] = []
        while True:
            try:
                events += self.pump()
                return events
            except AMQPError as err:
                events.append(("error", err.code, err.channel, err.hard))
                if err.hard:
                    self.sent += self.conn.close_connection(err)
                    return events
                if err.channel == 0:
                    raise AssertionError(f"a soft error must name its channel: {err}") from err
                self.sent += self.conn.close_channel(err)
            except BadProtocolHeader:
                events.append(("bad-header",))
                return events


def open_server(*channels: int, limits: Limits = LIMITS, **tune: int) -> Server:
    server = Server(limits)
    server.feed(client_handshake(**tune))
    assert server.conn.state is State.OPEN
    for channel in channels:
        [event] = server.feed(encode_method(channel, m.ChannelOpen()))
        assert event == MethodReceived(channel, m.ChannelOpen())
    return server


def expect_error(server: Server, data: bytes, code: ReplyCode) -> AMQPError:
    server.conn.receive_data(data)
    with pytest.raises(AMQPError) as info:
        server.pump()
    assert info.value.code == code
    return info.value


# -- the handshake --------------------------------------------------------------------------------


def test_full_handshake_byte_by_byte() -> None:
    server = Server()
    conn = server.conn
    assert conn.state is State.AWAIT_HEADER

    conn.receive_data(PROTOCOL_HEADER[:5])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(PROTOCOL_HEADER[5:])
    assert conn.next_event() == ProtocolHeaderReceived()
    assert conn.state is State.HEADER_RECEIVED  # type: ignore[comparison-overlap]  # it moved on
    assert conn.next_event() is NEED_DATA

    sent = conn.send_method(0, START)
    assert decode_frames(sent) == [(0, START)]
    assert conn.state is State.AWAIT_START_OK

    start_ok = m.ConnectionStartOk(CLIENT_PROPERTIES, "PLAIN", "\0guest\0guest", "en_US")
    conn.receive_data(encode_method(0, start_ok))
    assert conn.next_event() == MethodReceived(0, start_ok)
    assert conn.state is State.AUTHENTICATING

    conn.send_method(0, m.ConnectionTune(16, 8192, 60))
    assert conn.state is State.AWAIT_TUNE_OK

    conn.receive_data(encode_method(0, m.ConnectionTuneOk(8, 4096, 10)))
    assert conn.next_event() == MethodReceived(0, m.ConnectionTuneOk(8, 4096, 10))
    assert conn.state is State.AWAIT_OPEN
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (8, 4096, 10)

    conn.receive_data(encode_method(0, m.ConnectionOpen("/vhost")))
    assert conn.next_event() == MethodReceived(0, m.ConnectionOpen("/vhost"))
    assert conn.state is State.OPENING
    assert not conn.is_open

    conn.send_method(0, m.ConnectionOpenOk())
    assert conn.state is State.OPEN
    assert conn.is_open

    conn.receive_data(encode_method(1, m.ChannelOpen()))
    assert conn.next_event() == MethodReceived(1, m.ChannelOpen())
    assert conn.channel_is_open(1)
    assert not conn.channel_is_open(2)

    props = BasicProperties(
        content_type="text/plain", headers={"x": [1, "two"]}, delivery_mode=2, message_id="id"
    ).encode()
    pub = m.BasicPublish(0, "amq.topic", "a.b", mandatory=True)
    conn.receive_data(publish(1, b"hello", props, method=pub))
    assert conn.next_event() == ContentReceived(1, pub, [props], [b"hello"])
    assert conn.next_event() is NEED_DATA

    # a body over several frames, fed one byte at a time
    body = bytes(range(256)) * 40
    stream = publish(1, body, props, frame_max=4096)
    for i in range(len(stream) - 1):
        conn.receive_data(stream[i : i + 1])
        assert conn.next_event() is NEED_DATA
    conn.receive_data(stream[-1:])
    event = conn.next_event()
    assert isinstance(event, ContentReceived)
    assert event.properties == [props]
    assert event.bodies == [body]
    assert BasicProperties.decode(memoryview(event.properties[0])).headers == {"x": [1, "two"]}

    conn.receive_data(b"")
    assert conn.next_event() == EndOfStream()


def test_handshake_from_a_single_buffer() -> None:
    server = Server()
    events = server.feed(client_handshake() + encode_method(3, m.ChannelOpen()))
    assert [type(e) for e in events] == [ProtocolHeaderReceived] + [MethodReceived] * 4
    assert [type(e.method) for e in events[1:]] == [
        m.ConnectionStartOk,
        m.ConnectionTuneOk,
        m.ConnectionOpen,
        m.ChannelOpen,
    ]
    sent = [method for _, method in decode_frames(bytes(server.sent))]
    assert [type(x) for x in sent] == [m.ConnectionStart, m.ConnectionTune, m.ConnectionOpenOk]


def test_tune_ok_may_lower_the_limits() -> None:
    server = open_server(channel_max=1, frame_max=4096, heartbeat=0)
    assert (server.conn.channel_max, server.conn.frame_max, server.conn.heartbeat) == (1, 4096, 0)


def test_a_server_without_limits_accepts_zero_tune_values() -> None:
    """0 means "no limit" on both sides: any channel number, any frame size."""
    limits = Limits(channel_max=0, frame_max=0)
    server = open_server(limits=limits, channel_max=0, frame_max=0)
    assert (server.conn.channel_max, server.conn.frame_max) == (65535, 0)
    assert server.feed(encode_method(65535, m.ChannelOpen())) == [
        MethodReceived(65535, m.ChannelOpen())
    ]
    body = b"b" * 300_000
    [event] = server.feed(publish(65535, body, frame_max=0))
    assert event.bodies == [body]


def test_a_server_without_limits_takes_the_clients() -> None:
    limits = Limits(channel_max=0, frame_max=0)
    server = open_server(limits=limits, channel_max=5, frame_max=4096)
    assert (server.conn.channel_max, server.conn.frame_max) == (5, 4096)
    expect_error(server, struct.pack(">BHI", 3, 1, 4097), ReplyCode.FRAME_ERROR)


def test_empty_body_completes_with_the_header() -> None:
    server = open_server(1)
    [event] = server.feed(publish(1, b""))
    assert event == ContentReceived(1, m.BasicPublish(0, "amq.direct", "rk"), [b"\x00\x00"], [b""])


def test_empty_body_frames_are_allowed() -> None:
    server = open_server(1)
    data = encode_method(1, m.BasicPublish()) + frame(2, 1, content_header(3))
    data += frame(3, 1, b"") + frame(3, 1, b"ab") + frame(3, 1, b"") + frame(3, 1, b"c")
    [event] = server.feed(data)
    assert event.bodies == [b"abc"]


def test_interleaved_content_on_two_channels() -> None:
    server = open_server(1, 2)
    data = (
        encode_method(1, m.BasicPublish(routing_key="one"))
        + encode_method(2, m.BasicPublish(routing_key="two"))
        + frame(2, 1, content_header(4))
        + frame(2, 2, content_header(2))
        + frame(3, 1, b"ab")
        + frame(3, 2, b"xy")
        + HEARTBEAT_FRAME
        + frame(3, 1, b"cd")
    )
    events = server.feed(data)
    assert [(e.channel, e.method.routing_key, *e.bodies) for e in events] == [
        (2, "two", b"xy"),
        (1, "one", b"abcd"),
    ]


def test_heartbeats_produce_no_events() -> None:
    server = open_server()
    assert server.feed(HEARTBEAT_FRAME * 3) == []


def test_end_of_stream_mid_frame() -> None:
    server = open_server(1)
    server.conn.receive_data(encode_method(1, m.BasicQos(0, 10, False))[:-3])
    assert server.conn.next_event() is NEED_DATA
    server.conn.receive_data(b"")
    assert server.conn.next_event() == EndOfStream()


def test_end_of_stream_before_the_header() -> None:
    conn = ServerConnection()
    conn.receive_data(b"AMQ")
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    assert conn.next_event() == EndOfStream()


def test_peer_closes_a_channel() -> None:
    server = open_server(1)
    close = m.ChannelClose(200, "bye", 0, 0)
    assert server.feed(encode_method(1, close)) == [MethodReceived(1, close)]
    assert not server.conn.channel_is_open(1)  # the server answered close-ok
    assert decode_frames(bytes(server.sent))[-1] == (1, m.ChannelCloseOk())
    assert server.feed(encode_method(1, m.ChannelOpen())) == [MethodReceived(1, m.ChannelOpen())]


def test_late_close_ok_for_a_closed_channel_is_ignored() -> None:
    server = open_server()
    assert server.feed(encode_method(4, m.ChannelCloseOk())) == []


def test_peer_closes_the_connection() -> None:
    server = open_server(1)
    close = m.ConnectionClose(200, "bye", 0, 0)
    assert server.feed(encode_method(0, close)) == [MethodReceived(0, close)]
    assert server.conn.state is State.CLOSED
    assert decode_frames(bytes(server.sent))[-1] == (0, m.ConnectionCloseOk())


def test_update_secret_keeps_the_connection_open() -> None:
    server = open_server()
    update = m.ConnectionUpdateSecret("token", "refresh")
    assert server.feed(encode_method(0, update)) == [MethodReceived(0, update)]
    assert server.conn.state is State.OPEN


# -- protocol header ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"G",
        b"GET / HTTP/1.1\r\n",
        b"AMQX",
        b"AMQP\x01",
        b"AMQP\x00\x00\x09\x02",
        b"AMQP\x01\x01\x00\x09",  # the 0-9 header
        b"AMQP\x00\x00\x08\x00",
        b"AMQP\x03\x01\x00\x00",  # AMQP 1.0 over SASL
        b"\x01\x00\x00\x00\x00\x00\x00\xce",
    ],
)
def test_bad_protocol_header_is_detected_as_early_as_possible(data: bytes) -> None:
    conn = ServerConnection()
    conn.receive_data(data)
    with pytest.raises(BadProtocolHeader):
        conn.next_event()
    # framing is lost for good: nothing more is read
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.next_event() is NEED_DATA


@pytest.mark.parametrize("size", range(1, 8))
def test_correct_header_prefixes_wait_for_more(size: int) -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER[:size])
    assert conn.next_event() is NEED_DATA


def test_bytes_after_the_header_wait_for_connection_start() -> None:
    server = Server()
    events = server.feed(PROTOCOL_HEADER + encode_method(0, m.ConnectionStartOk()))
    assert events == [ProtocolHeaderReceived(), MethodReceived(0, m.ConnectionStartOk())]


# -- framing errors -------------------------------------------------------------------------------


def test_oversized_frame_is_rejected_from_its_head_alone() -> None:
    server = open_server(1)
    head = struct.pack(">BHI", 1, 1, LIMITS.frame_max + 1)
    err = expect_error(server, head, ReplyCode.FRAME_ERROR)
    assert err.hard
    server.conn.receive_data(b"\0" * 10)
    assert server.conn.next_event() is NEED_DATA


def test_oversized_frame_before_tune_uses_the_initial_frame_max() -> None:
    server = Server(Limits(frame_max=131072, initial_frame_max=4096))
    server.feed(PROTOCOL_HEADER)
    head = struct.pack(">BHI", 1, 0, 4097)
    expect_error(server, head, ReplyCode.FRAME_ERROR)


def test_largest_legal_frame_is_accepted() -> None:
    server = open_server(1)
    body = b"b" * (LIMITS.frame_max - 8)
    [event] = server.feed(publish(1, body, frame_max=LIMITS.frame_max))
    assert event.bodies == [body]


def test_frame_limit_follows_the_negotiated_frame_max() -> None:
    server = open_server(1, frame_max=4096)
    expect_error(server, struct.pack(">BHI", 3, 1, 5000), ReplyCode.FRAME_ERROR)


def test_bad_frame_end() -> None:
    server = open_server(1)
    data = encode_method(1, m.BasicQos(0, 1, False))[:-1] + b"\x00"
    err = expect_error(server, data, ReplyCode.FRAME_ERROR)
    assert err.hard
    server.conn.receive_data(encode_method(1, m.BasicQos(0, 1, False)))
    assert server.conn.next_event() is NEED_DATA


def test_unknown_frame_type() -> None:
    server = open_server(1)
    assert expect_error(server, frame(4, 1, b"x"), ReplyCode.FRAME_ERROR).hard


def test_heartbeat_on_a_channel() -> None:
    server = open_server(1)
    assert expect_error(server, frame(8, 1, b""), ReplyCode.UNEXPECTED_FRAME).hard


def test_heartbeat_with_payload() -> None:
    server = open_server()
    assert expect_error(server, frame(8, 0, b"x"), ReplyCode.FRAME_ERROR).hard


def test_content_frame_on_channel_zero() -> None:
    server = open_server()
    expect_error(server, frame(2, 0, content_header(0)), ReplyCode.UNEXPECTED_FRAME)


@pytest.mark.parametrize(
    ("channel", "payload"),
    [
        (1, struct.pack(">HH", 60, 80) + b"\0\0\0"),  # basic.ack cut short
        (1, struct.pack(">HH", 60, 10) + b"\0\0\0\0\0\x0a\0" + b"junk"),  # bytes left over
        (1, struct.pack(">HH", 90, 10) + b"\0"),  # tx.select takes no arguments
        (1, struct.pack(">HH", 50, 10) + b"\0\0\x05q"),  # shortstr past the end
        (1, struct.pack(">HH", 50, 10) + b"\0\0\x01q\0\0\0\x03\xe8"),  # table past the end
        (0, struct.pack(">HH", 10, 11) + b"\0\0\0\0\x05PLAIN"),  # start-ok cut short
    ],
)
def test_malformed_method_arguments(channel: int, payload: bytes) -> None:
    """A method whose arguments do not fill its payload exactly: 501, naming the method."""
    server = open_server(1) if channel else Server()
    if not channel:
        server.feed(PROTOCOL_HEADER)
    err = expect_error(server, frame(1, channel, payload), ReplyCode.FRAME_ERROR)
    assert err.hard
    class_id, method_id = struct.unpack_from(">HH", payload)
    assert (err.class_id, err.method_id) == (class_id, method_id)
    assert err.text.startswith("cannot decode ")


def test_method_frame_too_short_for_its_ids() -> None:
    server = open_server(1)
    err = expect_error(server, frame(1, 1, b"\x00\x3c"), ReplyCode.FRAME_ERROR)
    assert (err.class_id, err.method_id) == (0, 0)


@pytest.mark.parametrize("channel", [0, 1])
def test_unknown_method_id(channel: int) -> None:
    server = open_server(1)
    err = expect_error(
        server, frame(1, channel, struct.pack(">HH", 60, 99)), ReplyCode.COMMAND_INVALID
    )
    assert err.hard


# -- channels -------------------------------------------------------------------------------------


def test_method_on_an_unopened_channel() -> None:
    server = open_server(1)
    err = expect_error(server, encode_method(2, m.BasicQos(0, 1, False)), ReplyCode.CHANNEL_ERROR)
    assert err.hard
    assert (err.class_id, err.method_id) == (60, 10)


@pytest.mark.parametrize("kind", [2, 3])
def test_content_on_an_unopened_channel(kind: int) -> None:
    server = open_server(1)
    expect_error(server, frame(kind, 2, content_header(1)), ReplyCode.CHANNEL_ERROR)


def test_second_channel_open() -> None:
    server = open_server(1)
    err = expect_error(server, encode_method(1, m.ChannelOpen()), ReplyCode.CHANNEL_ERROR)
    assert (err.class_id, err.method_id) == (20, 10)


def test_channel_above_channel_max() -> None:
    server = open_server(channel_max=10)
    assert server.feed(encode_method(10, m.ChannelOpen())) == [MethodReceived(10, m.ChannelOpen())]
    err = expect_error(server, encode_method(11, m.ChannelOpen()), ReplyCode.NOT_ALLOWED)
    assert err.hard


def test_channel_at_the_servers_channel_max() -> None:
    server = open_server(channel_max=16)
    assert server.feed(encode_method(16, m.ChannelOpen())) == [MethodReceived(16, m.ChannelOpen())]
    expect_error(server, encode_method(17, m.ChannelOpen()), ReplyCode.NOT_ALLOWED)


def test_channel_frames_before_the_connection_is_open() -> None:
    server = Server()
    server.feed(PROTOCOL_HEADER)
    expect_error(server, encode_method(1, m.ChannelOpen()), ReplyCode.UNEXPECTED_FRAME)


def test_connection_method_on_a_channel() -> None:
    server = open_server(1)
    expect_error(
        server, encode_method(1, m.ConnectionClose(200, "", 0, 0)), ReplyCode.COMMAND_INVALID
    )


@pytest.mark.parametrize(
    "method",
    [
        m.BasicDeliver("c", 1, False, "", ""),
        m.BasicGetOk(1, False, "", "", 0),
        m.BasicReturn(312, "NO_ROUTE", "", ""),
    ],
)
def test_server_only_content_methods(method: m.Method) -> None:
    server = open_server(1)
    expect_error(server, encode_method(1, method), ReplyCode.COMMAND_INVALID)


@pytest.mark.parametrize(
    ("prefix", "method"),
    [
        (b"", m.ConnectionOpen("/")),  # open before start-ok
        (b"", m.ConnectionTuneOk(16, 8192, 0)),  # tune-ok before start-ok
        (encode_method(0, m.ConnectionStartOk()), m.ConnectionOpen("/")),  # before tune
        (encode_method(0, m.ConnectionStartOk()), m.ChannelOpen()),  # channel.open on channel 0
    ],
)
def test_connection_methods_out_of_order(prefix: bytes, method: m.Method) -> None:
    """RabbitMQ's handle_method0 fallback: 504 "unexpected method in connection state"."""
    server = Server()
    server.feed(PROTOCOL_HEADER + prefix)
    err = expect_error(server, encode_method(0, method), ReplyCode.CHANNEL_ERROR)
    assert err.hard
    assert (err.class_id, err.method_id) == (method.CLASS_ID, method.METHOD_ID)


def test_start_ok_twice() -> None:
    server = Server()
    server.feed(PROTOCOL_HEADER + encode_method(0, m.ConnectionStartOk()))
    expect_error(server, encode_method(0, m.ConnectionStartOk()), ReplyCode.CHANNEL_ERROR)


@pytest.mark.parametrize(
    "method",
    [
        m.ConnectionStartOk({}, "PLAIN", "\0guest\0guest", "en_US"),
        m.ConnectionTuneOk(16, 8192, 0),
        m.ConnectionOpen("/"),
        m.ChannelOpen(),
        m.BasicQos(0, 1, False),
    ],
)
def test_handshake_and_channel_methods_on_channel_zero_once_open(method: m.Method) -> None:
    server = open_server()
    err = expect_error(server, encode_method(0, method), ReplyCode.CHANNEL_ERROR)
    assert err.hard
    assert (err.class_id, err.method_id) == (method.CLASS_ID, method.METHOD_ID)
    assert err.text == "unexpected method in connection state running"  # rabbit_reader's words


# -- tune-ok --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tune",
    [
        {"frame_max": 8193},  # above the server's
        {"frame_max": 2**32 - 1},
        {"frame_max": 0},  # "no limit" is above the server's limit
        {"frame_max": 4095},  # below the AMQP minimum
        {"frame_max": 1},
        {"channel_max": 17},
        {"channel_max": 65535},
        {"channel_max": 0},
    ],
)
def test_bad_tune_ok(tune: dict[str, int]) -> None:
    """RabbitMQ's validate_negotiated_integer_value: 530 NOT_ALLOWED naming the field."""
    server = Server()
    server.feed(PROTOCOL_HEADER + encode_method(0, m.ConnectionStartOk()))
    tune_ok = m.ConnectionTuneOk(**({"channel_max": 16, "frame_max": 8192} | tune))
    err = expect_error(server, encode_method(0, tune_ok), ReplyCode.NOT_ALLOWED)
    assert err.hard
    assert (err.class_id, err.method_id) == (10, 31)
    [name] = tune
    assert err.text.startswith(f"negotiated {name} = {tune[name]} is ")


def test_smallest_frame_max_is_accepted() -> None:
    server = open_server(frame_max=4096)
    assert server.conn.frame_max == 4096


# -- content errors -------------------------------------------------------------------------------


PUBLISH_IDS = (60, 40)


def test_content_header_without_publish() -> None:
    server = open_server(1)
    err = expect_error(server, frame(2, 1, content_header(1)), ReplyCode.UNEXPECTED_FRAME)
    assert err.hard
    assert (err.class_id, err.method_id) == (0, 0)
    assert err.text == "expected method frame, got non method frame instead"


def test_body_without_publish() -> None:
    server = open_server(1)
    expect_error(server, frame(3, 1, b"x"), ReplyCode.UNEXPECTED_FRAME)


def test_body_before_the_header() -> None:
    server = open_server(1)
    server.feed(encode_method(1, m.BasicPublish()))
    err = expect_error(server, frame(3, 1, b"x"), ReplyCode.UNEXPECTED_FRAME)
    assert (err.class_id, err.method_id) == PUBLISH_IDS
    assert err.text.startswith("expected content header for class 60")


def test_second_content_header() -> None:
    server = open_server(1)
    server.feed(encode_method(1, m.BasicPublish()) + frame(2, 1, content_header(5)))
    err = expect_error(server, frame(2, 1, content_header(5)), ReplyCode.UNEXPECTED_FRAME)
    assert (err.class_id, err.method_id) == PUBLISH_IDS
    assert err.text.startswith("expected content body")


@pytest.mark.parametrize("header_sent", [False, True])
def test_method_while_content_is_owed(header_sent: bool) -> None:
    server = open_server(1)
    data = encode_method(1, m.BasicPublish())
    if header_sent:
        data += frame(2, 1, content_header(10)) + frame(3, 1, b"12345")
    assert server.feed(data) == []
    err = expect_error(server, encode_method(1, m.BasicAck(1, False)), ReplyCode.UNEXPECTED_FRAME)
    assert err.hard
    # like RabbitMQ's command assembler, the error names the content's method, not the intruder
    assert (err.class_id, err.method_id) == PUBLISH_IDS
    assert err.text == (  # rabbit_command_assembler's words
        "expected content body, got non content body frame instead"
        if header_sent
        else "expected content header for class 60, got non content header frame instead"
    )


def test_publish_while_content_is_owed() -> None:
    server = open_server(1)
    server.feed(encode_method(1, m.BasicPublish()))
    err = expect_error(server, encode_method(1, m.BasicPublish()), ReplyCode.UNEXPECTED_FRAME)
    assert (err.class_id, err.method_id) == PUBLISH_IDS


def test_body_overrun() -> None:
    server = open_server(1)
    data = encode_method(1, m.BasicPublish()) + frame(2, 1, content_header(4))
    server.feed(data + frame(3, 1, b"ab"))
    err = expect_error(server, frame(3, 1, b"cde"), ReplyCode.FRAME_ERROR)
    assert err.hard
    assert (err.class_id, err.method_id) == PUBLISH_IDS


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">HHQ", 50, 0, 1) + b"\0\0",  # class mismatch
        struct.pack(">HHQ", 0, 0, 1) + b"\0\0",
        struct.pack(">HHQ", 60, 1, 1) + b"\0\0",  # non-zero weight
    ],
)
def test_content_header_class_mismatch(payload: bytes) -> None:
    server = open_server(1)
    server.feed(encode_method(1, m.BasicPublish()))
    err = expect_error(server, frame(2, 1, payload), ReplyCode.UNEXPECTED_FRAME)
    assert err.hard
    assert (err.class_id, err.method_id) == PUBLISH_IDS


def test_short_content_header() -> None:
    server = open_server(1)
    server.feed(encode_method(1, m.BasicPublish()))
    expect_error(server, frame(2, 1, struct.pack(">HHQ", 60, 0, 1)), ReplyCode.FRAME_ERROR)


def test_message_larger_than_max_message_size() -> None:
    server = open_server(1, 2)
    size = LIMITS.max_message_size + 1
    data = encode_method(1, m.BasicPublish()) + frame(2, 1, content_header(size))
    err = expect_error(server, data, ReplyCode.PRECONDITION_FAILED)
    assert not err.hard
    assert err.channel == 1
    assert (err.class_id, err.method_id) == (60, 40)

    sent = server.conn.close_channel(err)
    [(channel, close)] = decode_frames(sent)
    assert channel == 1
    assert isinstance(close, m.ChannelClose)
    assert close.reply_code == 406
    assert close.reply_text.startswith("PRECONDITION_FAILED - message size")
    assert (close.class_id, close.method_id) == (60, 40)
    assert not server.conn.channel_is_open(1)

    # the rest of the message, and anything else on channel 1, is discarded until close-ok
    discarded = (
        frame(3, 1, b"x" * 5000)
        + frame(3, 1, b"y" * 5000)
        + encode_method(1, m.BasicAck(1, False))
        + frame(2, 1, content_header(1))
        + encode_method(1, m.BasicPublish())
    )
    other = encode_method(2, m.BasicQos(0, 5, False))
    assert server.feed(discarded + other) == [MethodReceived(2, m.BasicQos(0, 5, False))]
    assert server.feed(encode_method(1, m.ChannelCloseOk())) == [
        MethodReceived(1, m.ChannelCloseOk())
    ]
    assert 1 not in server.conn.channels
    assert server.feed(encode_method(1, m.ChannelOpen())) == [MethodReceived(1, m.ChannelOpen())]


@pytest.mark.parametrize("size", [MAX_BODY_SIZE + 1, 2**40, 2**64 - 1])
def test_body_size_above_the_hard_cap(size: int) -> None:
    """Above RabbitMQ's 512 MiB cap the connection fails (501), whatever max_message_size says."""
    server = open_server(1, limits=Limits(max_message_size=2**62))
    data = encode_method(1, m.BasicPublish()) + frame(2, 1, content_header(size))
    err = expect_error(server, data, ReplyCode.FRAME_ERROR)
    assert err.hard
    assert (err.class_id, err.method_id) == PUBLISH_IDS
    assert err.text == f"content body size {size} exceeds maximum allowed size {MAX_BODY_SIZE}"


def test_body_size_at_the_hard_cap_is_left_to_max_message_size() -> None:
    server = open_server(1)
    data = encode_method(1, m.BasicPublish()) + frame(2, 1, content_header(MAX_BODY_SIZE))
    assert expect_error(server, data, ReplyCode.PRECONDITION_FAILED).channel == 1


def test_message_of_exactly_max_message_size_is_accepted() -> None:
    limits = Limits(max_message_size=10)
    server = open_server(1, limits=limits)
    [event] = server.feed(publish(1, b"0123456789"))
    assert event.bodies == [b"0123456789"]


# -- closing --------------------------------------------------------------------------------------


def test_channel_open_on_a_closing_channel_is_a_second_open() -> None:
    """RabbitMQ answers channel.open before close-ok with 504 "second 'channel.open' seen"."""
    server = open_server(1)
    server.send(1, m.ChannelClose(406, "PRECONDITION_FAILED - nope", 50, 10))
    with pytest.raises(AMQPError) as info:
        server.feed(encode_method(1, m.ChannelOpen()))
    assert info.value.code == ReplyCode.CHANNEL_ERROR
    assert (info.value.class_id, info.value.method_id) == (20, 10)


def test_frames_after_channel_close_are_discarded_except_close_and_close_ok() -> None:
    server = open_server(1, 2)
    server.feed(encode_method(1, m.BasicPublish()) + frame(2, 1, content_header(10)))
    server.send(1, m.ChannelClose(406, "PRECONDITION_FAILED - nope", 50, 10))
    assert not server.conn.channel_is_open(1)
    discarded = [
        frame(3, 1, b"x" * 10),
        frame(3, 1, b"overrun" * 10),
        encode_method(1, m.BasicQos(0, 1, False)),
        frame(1, 1, struct.pack(">HH", 60, 99)),  # unknown method
        frame(1, 1, struct.pack(">HH", 60, 80) + b"\0"),  # undecodable basic.ack
        frame(1, 1, b"\0"),  # too short for ids
        frame(2, 1, content_header(10**9)),
        encode_method(1, m.ConnectionClose(200, "", 0, 0)),
    ]
    assert server.feed(b"".join(discarded)) == []
    # channel 2 is unaffected
    assert server.feed(encode_method(2, m.BasicAck(3, True))) == [
        MethodReceived(2, m.BasicAck(3, True))
    ]
    # the peer's own channel.close still counts (the server answers close-ok and keeps waiting)
    close = m.ChannelClose(200, "client", 0, 0)
    assert server.feed(encode_method(1, close)) == [MethodReceived(1, close)]
    assert 1 in server.conn.channels
    assert server.feed(encode_method(1, m.ChannelCloseOk())) == [
        MethodReceived(1, m.ChannelCloseOk())
    ]
    assert 1 not in server.conn.channels


def test_frames_after_connection_close_are_discarded_except_close_and_close_ok() -> None:
    server = open_server(1)
    server.feed(encode_method(1, m.BasicPublish()))
    server.sent += server.conn.close_connection(AMQPError(ReplyCode.CONNECTION_FORCED, "shutdown"))
    assert server.conn.state is State.CLOSING
    assert decode_frames(bytes(server.sent))[-1][1].reply_code == 320
    discarded = [
        encode_method(1, m.BasicQos(0, 1, False)),
        frame(2, 1, content_header(1)),
        frame(3, 1, b"x"),
        encode_method(2, m.ChannelOpen()),
        encode_method(0, m.ConnectionOpen("/")),
        encode_method(0, m.ConnectionTuneOk(1, 4096, 0)),
        frame(1, 0, struct.pack(">HH", 10, 99)),  # unknown method
        frame(1, 0, struct.pack(">HH", 60, 80)),  # undecodable
        frame(1, 0, b""),
        frame(2, 0, content_header(1)),
        frame(8, 3, b""),  # heartbeat on a channel
        frame(8, 0, b"junk"),  # heartbeat with payload
        frame(9, 0, b"?"),  # unknown frame type
        encode_method(1, m.ChannelCloseOk()),
        HEARTBEAT_FRAME,
    ]
    assert server.feed(b"".join(discarded)) == []
    close = m.ConnectionClose(200, "client", 0, 0)
    assert server.feed(encode_method(0, close)) == [MethodReceived(0, close)]
    assert server.conn.state is State.CLOSING
    assert server.feed(encode_method(0, m.ConnectionCloseOk())) == [
        MethodReceived(0, m.ConnectionCloseOk())
    ]
    assert server.conn.state is State.CLOSED  # type: ignore[comparison-overlap]  # it moved on
    assert server.feed(encode_method(0, m.ConnectionCloseOk()) + frame(9, 0, b"")) == []


def test_close_connection_carries_the_error() -> None:
    server = open_server(1)
    err = AMQPError(ReplyCode.CHANNEL_ERROR, "x" * 300, class_id=60, method_id=40)
    [(channel, close)] = decode_frames(server.conn.close_connection(err))
    assert channel == 0
    assert close == m.ConnectionClose(504, close.reply_text, 60, 40)
    assert close.reply_text.startswith("CHANNEL_ERROR - xxx")
    assert len(close.reply_text.encode()) == 255
    assert server.conn.state is State.CLOSING


def test_frames_after_a_hard_framing_error_are_not_read() -> None:
    server = open_server(1)
    expect_error(server, frame(7, 1, b""), ReplyCode.FRAME_ERROR)
    server.conn.receive_data(encode_method(1, m.BasicQos(0, 1, False)))
    assert server.conn.next_event() is NEED_DATA
    server.conn.receive_data(b"")
    assert server.conn.next_event() == EndOfStream()


# -- properties: chunking and garbage -------------------------------------------------------------

names = st.text(alphabet="abcxyz.-", max_size=12)


@st.composite
def client_streams(draw: Any) -> tuple[bytes, list[tuple[int, bytes, bytes]]]:
    """A valid client byte stream after the handshake, and the messages it publishes."""
    parts: list[bytes] = [encode_method(1, m.ChannelOpen()), encode_method(2, m.ChannelOpen())]
    published: list[tuple[int, bytes, bytes]] = []
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["publish", "pair", "method", "heartbeat"]))
        if op == "publish":
            channel = draw(st.sampled_from([1, 2]))
            props = draw(basic_properties).encode()
            body = draw(st.binary(max_size=200))
            pub = m.BasicPublish(0, draw(names), draw(names), draw(st.booleans()))
            parts.append(publish(channel, body, props, draw(st.integers(9, 64)), pub))
            published.append((channel, props, body))
        elif op == "pair":  # two publishes on two channels with their frames interleaved
            queues = []
            for channel in (1, 2):
                body = draw(st.binary(max_size=100))
                out = bytearray(encode_method(channel, m.BasicPublish(routing_key=str(channel))))
                write_content(out, channel, b"\x00\x00", body, draw(st.integers(9, 40)))
                frames_, pos = [], 0
                while pos < len(out):
                    size = struct.unpack_from(">I", out, pos + 3)[0]
                    frames_.append(bytes(out[pos : pos + 8 + size]))
                    pos += 8 + size
                queues.append(frames_)
                published.append((channel, b"\x00\x00", body))
            done = [0, 0]
            while done[0] < len(queues[0]) or done[1] < len(queues[1]):
                pick = draw(st.sampled_from([i for i in (0, 1) if done[i] < len(queues[i])]))
                parts.append(queues[pick][done[pick]])
                done[pick] += 1
        elif op == "method":
            channel = draw(st.sampled_from([1, 2]))
            method = draw(
                st.one_of(
                    st.builds(m.BasicAck, st.integers(0, 2**64 - 1), st.booleans()),
                    st.builds(m.BasicQos, st.integers(0, 2**32 - 1), st.integers(0, 65535)),
                    st.builds(m.QueueDeclare, queue=names, arguments=field_tables),
                    st.builds(m.ExchangeBind, destination=names, arguments=field_tables),
                )
            )
            parts.append(encode_method(channel, method))
        else:
            parts.append(HEARTBEAT_FRAME)
    if draw(st.booleans()):
        parts.append(encode_method(2, m.ChannelClose(200, "bye", 0, 0)))
    if draw(st.booleans()):
        parts.append(encode_method(0, m.ConnectionClose(200, "bye", 0, 0)))
    return b"".join(parts), published


def one_per_publish(events: list[Any]) -> list[Any]:
    """``events`` with each run of publishes (``ContentReceived``) as one event per publish:
    how publishes group into runs depends on how the stream was cut."""
    out: list[Any] = []
    for event in events:
        if isinstance(event, ContentReceived):
            out += [
                ContentReceived(event.channel, event.method, [properties], [body])
                for properties, body in zip(event.properties, event.bodies, strict=True)
            ]
        else:
            out.append(event)
    return out


def run_chunks(stream: bytes, cuts: list[int]) -> tuple[list[Any], bytes]:
    server = Server()
    bounds = [0, *sorted(set(cuts)), len(stream)]
    events: list[Any] = []
    for start, end in itertools.pairwise(bounds):
        events += server.feed(stream[start:end])
    return one_per_publish(events), bytes(server.sent)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client_streams(), st.data())
def test_every_chunking_yields_the_same_events(
    scenario: tuple[bytes, list[tuple[int, bytes, bytes]]], data: Any
) -> None:
    tail, published = scenario
    stream = client_handshake(frame_max=4096) + tail
    whole, whole_sent = run_chunks(stream, [])
    cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=40), label="cuts")
    assert run_chunks(stream, cuts) == (whole, whole_sent)
    # the events say what the stream says
    assert isinstance(whole[0], ProtocolHeaderReceived)
    contents = [
        (e.channel, *e.properties, *e.bodies) for e in whole if isinstance(e, ContentReceived)
    ]
    assert sorted(contents) == sorted(published)


def test_one_byte_chunks_yield_the_same_events() -> None:
    props = BasicProperties(content_type="a/b", headers={"h": [1.5, None, b"x"]}).encode()
    stream = (
        client_handshake(frame_max=4096)
        + encode_method(1, m.ChannelOpen())
        + publish(1, b"x" * 9000, props, frame_max=4096)
        + HEARTBEAT_FRAME
        + publish(1, b"", props)
        + encode_method(1, m.BasicAck(5, True))
        + encode_method(0, m.ConnectionClose(200, "", 0, 0))
    )
    whole = run_chunks(stream, [])
    assert run_chunks(stream, list(range(1, len(stream)))) == whole
    events = whole[0]
    assert [type(e).__name__ for e in events] == [
        "ProtocolHeaderReceived",
        "MethodReceived",
        "MethodReceived",
        "MethodReceived",
        "MethodReceived",
        "ContentReceived",
        "ContentReceived",
        "MethodReceived",
        "MethodReceived",
    ]
    assert events[5].bodies == [b"x" * 9000]
    assert events[5].properties == [props]


channel_methods = st.one_of(
    st.builds(m.ChannelOpen),
    st.builds(m.ChannelClose, st.integers(0, 600), names, st.integers(0, 90), st.integers(0, 120)),
    st.builds(m.ChannelCloseOk),
    st.builds(m.ChannelFlow, st.booleans()),
    st.builds(m.BasicAck, st.integers(0, 2**64 - 1), st.booleans()),
    st.builds(m.BasicQos, st.integers(0, 2**32 - 1), st.integers(0, 65535)),
    st.builds(m.QueueDeclare, queue=names, arguments=field_tables),
    st.builds(m.BasicPublish, exchange=names, routing_key=names),
    any_method,
)


def _random_frame(draw: Any) -> bytes:
    """Mostly well-formed frames (so the fuzz gets past the first error now and then), some of
    them mutated, some of them raw garbage."""
    shape = draw(st.sampled_from(["publish", "partial", "method", "method", "frame"]))
    channel = draw(st.sampled_from([1, 1, 1, 2, 0, 3, 9, 65535]))
    if shape == "publish":
        body = draw(st.binary(max_size=150))
        return publish(channel, body, draw(basic_properties).encode(), draw(st.integers(9, 64)))
    if shape == "partial":  # a publish whose content is cut short or over-announced
        head = content_header(draw(st.integers(0, 300)), draw(basic_properties).encode())
        bodies = draw(st.lists(st.binary(max_size=60), max_size=3))
        return (
            encode_method(channel, m.BasicPublish())
            + frame(2, channel, head)
            + b"".join(frame(3, channel, b) for b in bodies)
        )
    if shape == "method":
        payload = draw(channel_methods).encode()
        kind = 1
    else:
        kind = draw(st.sampled_from([1, 2, 3, 8, 0, 4, 206]))
        payload_kind = draw(st.sampled_from(["method", "header", "random"]))
        if payload_kind == "method":
            payload = draw(any_method).encode()
        elif payload_kind == "header":
            payload = content_header(draw(st.integers(0, 300)), draw(basic_properties).encode())
        else:
            payload = draw(st.binary(max_size=30))
    if payload and draw(st.integers(0, 3)) == 0:
        mutated = bytearray(payload)
        mutated[draw(st.integers(0, len(payload) - 1))] = draw(st.integers(0, 255))
        payload = bytes(mutated)
    raw = frame(kind, channel, payload)
    if draw(st.integers(0, 15)) == 0:  # now and then, break the framing itself
        raw = raw[: draw(st.integers(0, len(raw)))] + draw(st.binary(max_size=8))
    return raw


random_frames = st.composite(_random_frame)()
garbage = st.one_of(
    st.binary(max_size=200),
    st.lists(random_frames, max_size=12).map(b"".join),
)


def run_garbage(prefix: bytes, junk: bytes, cuts: list[int]) -> list[Any]:
    server = Server(Limits(channel_max=8, frame_max=4096, max_message_size=100))
    events = server.feed_tolerant(prefix)
    bounds = [0, *sorted({c % (len(junk) + 1) for c in cuts}), len(junk)]
    for start, end in itertools.pairwise(bounds):
        events += server.feed_tolerant(junk[start:end])
        if events and isinstance(events[-1], tuple) and events[-1][0] == "bad-header":
            break
    server.conn.receive_data(b"")
    for _ in range(3):
        try:
            event = server.conn.next_event()
        except (AMQPError, BadProtocolHeader):
            continue
        assert event is NEED_DATA or isinstance(
            event, EndOfStream | MethodReceived | ContentReceived
        )
    return events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage, st.lists(st.integers(0, 10_000), max_size=5))
@example(frame(1, 0, struct.pack(">HH", 10, 50)), [])
def test_garbage_after_the_handshake_only_raises_protocol_errors(
    junk: bytes, cuts: list[int]
) -> None:
    prefix = client_handshake(channel_max=8, frame_max=4096) + encode_method(1, m.ChannelOpen())
    run_garbage(prefix, junk, cuts)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([b"", PROTOCOL_HEADER]), garbage, st.lists(st.integers(0, 10_000), max_size=5)
)
def test_garbage_from_the_start_only_raises_protocol_errors(
    prefix: bytes, junk: bytes, cuts: list[int]
) -> None:
    run_garbage(prefix, junk, cuts)
