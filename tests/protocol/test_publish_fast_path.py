"""The publish fast path: ``ServerConnection`` parses a complete publish (method, content header,
body frames) in one go, and ``check_properties`` validates property blocks without decoding them.
Both must be invisible: the same events, the same errors (code, text, ids) and the same bytes sent
as the frame-by-frame path and the full decoder, however the stream is cut."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.support.rawamqp import RawAMQP, body_frame, content_header
from tqbroker.config import BrokerConfig
from tqbroker.protocol import methods as m
from tqbroker.protocol import properties as protocol
from tqbroker.protocol._fastpath import PUBLISHES_MAX, RUN_MAX, FastPath
from tqbroker.protocol.connection import (
    MAX_BODY_SIZE,
    NEED_DATA,
    BadProtocolHeader,
    ContentReceived,
    EndOfStream,
    Limits,
    ServerConnection,
    State,
)
from tqbroker.protocol.errors import AMQPError, DecodeError
from tqbroker.protocol.frames import HEARTBEAT_FRAME, encode_method, write_content
from tqbroker.protocol.methods import BasicProperties
from tqbroker.protocol.properties import check_properties, decode_properties
from tqbroker.testing import RunningBroker, running_broker

from .strategies import basic_properties, field_tables
from .test_connection import (
    Server,
    client_handshake,
    frame,
    names,
    one_per_publish,
    random_frames,
)

LIMITS = Limits(channel_max=8, frame_max=4096, heartbeat=30, max_message_size=500)


class NoFastPath(FastPath):
    """A fast path that takes nothing."""

    __slots__ = ()

    def publish(self, buf: bytes, pos: int, channel: int, size: int) -> ContentReceived | None:
        return None


class FrameByFrame(ServerConnection):
    """The connection without its fast path: every frame through the general code."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self._fastpath = NoFastPath(self.channels, self._frame_limit, 0)


class CountingFastPath(FastPath):
    """The fast path, counting the publishes it took."""

    __slots__ = ()

    def publish(self, buf: bytes, pos: int, channel: int, size: int) -> ContentReceived | None:
        event = super().publish(buf, pos, channel, size)
        Counting.fast += 0 if event is None else len(event.bodies)
        return event


class Counting(ServerConnection):
    """The connection, counting the publishes its fast path took."""

    fast = 0

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        body_max = min(limits.max_message_size, MAX_BODY_SIZE)
        self._fastpath = CountingFastPath(self.channels, self._frame_limit, body_max)


def run(stream: bytes, cuts: list[int], *, fast: bool) -> tuple[list[Any], bytes]:
    """Feed ``stream`` cut at ``cuts`` the way the I/O layer does (a soft error closes its
    channel and reading goes on, a hard one ends it); every event and error, and what was sent."""
    server = Server(LIMITS)
    server.conn = Counting(LIMITS) if fast else FrameByFrame(LIMITS)
    conn = server.conn
    events: list[Any] = []
    bounds = [0, *sorted({1 + c % (len(stream) - 1) for c in cuts}), len(stream)]  # no b""
    for start, end in itertools.pairwise(bounds):
        conn.receive_data(stream[start:end])
        while True:
            try:
                event = conn.next_event()
            except AMQPError as err:
                events.append(
                    ("error", err.code, err.reply_text, err.channel, err.class_id, err.method_id)
                )
                if err.hard or not err.channel:
                    server.sent += conn.close_connection(err)
                    return one_per_publish(events), bytes(server.sent)
                server.sent += conn.close_channel(err)
                continue
            except BadProtocolHeader:
                events.append(("bad-header",))
                return one_per_publish(events), bytes(server.sent)
            if event is NEED_DATA:
                break
            events.append(event)
            server.react(event)
            if isinstance(event, EndOfStream):
                return one_per_publish(events), bytes(server.sent)
    return one_per_publish(events), bytes(server.sent)


def split_frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size = struct.unpack_from(">I", data, pos + 3)[0]
        out.append(data[pos : pos + 8 + size])
        pos += 8 + size
    return out


@st.composite
def publishes(draw: Any, faults: bool) -> bytes:
    """One publish on channel 1 or 2, body frames of up to frame_max or smaller; with
    ``faults``, one frame mutated, dropped, doubled, moved to another channel or with a bad end
    marker, or on channel 3 (never opened), or larger than max_message_size."""
    channel = draw(st.sampled_from([1, 1, 1, 2, 3] if faults else [1, 1, 2]))
    body = draw(
        st.one_of(st.binary(max_size=64), st.integers(0, 700 if faults else 500).map(b"b".__mul__))
    )
    props = draw(basic_properties).encode()
    method = m.BasicPublish(0, draw(names), draw(names), draw(st.booleans()), draw(st.booleans()))
    out = bytearray(encode_method(channel, method))
    write_content(out, channel, props, body, draw(st.sampled_from([4096, 4096, 64, 9])))
    frames_ = split_frames(bytes(out))
    change = (
        draw(st.sampled_from(["none", "mutate", "drop", "double", "channel", "end"]))
        if faults
        else "none"
    )
    if change != "none":
        i = draw(st.integers(0, len(frames_) - 1))
        target = bytearray(frames_[i])
        if change == "mutate":
            target[draw(st.integers(0, len(target) - 1))] = draw(st.integers(0, 255))
            frames_[i] = bytes(target)
        elif change == "drop":
            del frames_[i]
        elif change == "double":
            frames_.insert(i, frames_[i])
        elif change == "channel":
            struct.pack_into(">H", target, 1, draw(st.sampled_from([0, 1, 2])))
            frames_[i] = bytes(target)
        else:
            target[-1] = draw(st.integers(0, 255))
            frames_[i] = bytes(target)
    return b"".join(frames_)


benign = st.one_of(
    st.just(HEARTBEAT_FRAME),
    st.builds(lambda ch: encode_method(ch, m.BasicAck(1, False)), st.sampled_from([1, 2])),
    st.builds(lambda ch: encode_method(ch, m.ChannelOpen()), st.sampled_from([1, 3, 3, 3])),
    st.builds(lambda ch: encode_method(ch, m.QueueDeclare(queue="q")), st.sampled_from([1, 2])),
)
closing = st.one_of(
    st.builds(lambda ch: encode_method(ch, m.ChannelClose(200, "", 0, 0)), st.sampled_from([1, 2])),
    st.just(encode_method(0, m.ConnectionClose(200, "bye", 0, 0))),
    random_frames,
)


@st.composite
def streams(draw: Any) -> bytes:
    """A client's bytes: the handshake, channels 1 and 2 opened, then a shuffle of a few valid
    publishes and anything else (publishes with a fault, other frames, closes, garbage)."""
    valid = draw(st.lists(publishes(faults=False), min_size=2, max_size=8))
    # The same publish several times in a row, as publishers send them: one run of the fast
    # path, ended by whatever differs (the stream's cuts, another frame, or a last copy with a
    # byte changed: in a frame head, the properties, the body or an end marker).
    last = bytearray(valid[0])
    if draw(st.booleans()):
        last[draw(st.integers(0, len(last) - 1))] = draw(st.integers(0, 255))
    valid.append(valid[0] * draw(st.integers(1, 5)) + bytes(last))
    others = draw(
        st.lists(
            st.one_of(publishes(faults=False), publishes(faults=True), benign, closing),
            max_size=8,
        )
    )
    parts = draw(st.permutations(valid + others))
    return (
        client_handshake(channel_max=8, frame_max=4096)
        + encode_method(1, m.ChannelOpen())
        + encode_method(2, m.ChannelOpen())
        + b"".join(parts)
    )


# The two properties below run a quarter of their examples in the default set (the full
# counts take minutes on 2 busy cores) and all of them with ``-m slow``.
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.lists(st.integers(0, 100_000), max_size=8))
@example(
    client_handshake(channel_max=8, frame_max=4096)
    + encode_method(1, m.ChannelOpen())
    + encode_method(1, m.BasicPublish(0, "", "q"))
    + frame(2, 1, struct.pack(">HHQ", 60, 0, 501) + b"\x00\x00"),  # over max_message_size
    [],
)
def test_the_fast_path_is_the_frame_by_frame_path(stream: bytes, cuts: list[int]) -> None:
    fast_path_is_frame_by_frame(stream, cuts)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.lists(st.integers(0, 100_000), max_size=8))
def test_the_fast_path_is_the_frame_by_frame_path_at_length(stream: bytes, cuts: list[int]) -> None:
    fast_path_is_frame_by_frame(stream, cuts)


def fast_path_is_frame_by_frame(stream: bytes, cuts: list[int]) -> None:
    expected = run(stream, [], fast=False)
    Counting.fast = 0
    assert run(stream, [], fast=True) == expected
    contents = sum(isinstance(e, ContentReceived) for e in expected[0])
    fast = "none" if not Counting.fast else "some" if Counting.fast < contents else "all"
    event(f"{contents} messages, fast path for {fast}")
    event(f"errors: {sum(isinstance(e, tuple) for e in expected[0])}")
    assert run(stream, cuts, fast=True) == expected
    assert run(stream, cuts, fast=False) == expected


def test_a_stream_of_publishes_takes_the_fast_path() -> None:
    props = BasicProperties(content_type="text/plain", delivery_mode=2).encode()
    one = bytearray(encode_method(1, m.BasicPublish(0, "amq.direct", "rk")))
    write_content(one, 1, props, b"x" * 100, 4096)
    multi = bytearray(encode_method(1, m.BasicPublish(0, "", "q", True)))
    write_content(multi, 1, b"\x00\x00", b"y" * 9000, 4096)  # three body frames
    empty = encode_method(1, m.BasicPublish(0, "", "q")) + frame(
        2, 1, struct.pack(">HHQ", 60, 0, 0) + b"\x00\x00"
    )
    server = Server(Limits(frame_max=4096))
    server.conn = Counting(server.limits)
    server.feed(client_handshake(frame_max=4096) + encode_method(1, m.ChannelOpen()))
    Counting.fast = 0
    events = server.feed(bytes(one) * 3 + bytes(multi) + empty)
    assert Counting.fast == 5
    assert events == [  # the three repeats of one method frame: one run
        ContentReceived(1, m.BasicPublish(0, "amq.direct", "rk"), [props] * 3, [b"x" * 100] * 3),
        ContentReceived(1, m.BasicPublish(0, "", "q", True), [b"\x00\x00"], [b"y" * 9000]),
        ContentReceived(1, m.BasicPublish(0, "", "q"), [b"\x00\x00"], [b""]),
    ]
    assert server.conn.state is State.OPEN
    assert server.conn.next_event() is NEED_DATA


def test_a_run_stops_at_its_limit_and_at_what_differs() -> None:
    server = Server(LIMITS)
    server.feed(client_handshake(channel_max=8, frame_max=4096) + encode_method(1, m.ChannelOpen()))
    out = bytearray()
    for i in range(RUN_MAX + 10):
        out += encode_method(1, m.BasicPublish(0, "ex", "same"))
        write_content(out, 1, b"\x00\x00", b"%d" % i, 4096)
    out += encode_method(1, m.BasicPublish(0, "ex", "other"))
    write_content(out, 1, b"\x00\x00", b"last", 4096)
    full, rest, other = server.feed(bytes(out))
    assert full.bodies == [b"%d" % i for i in range(RUN_MAX)]
    assert rest.bodies == [b"%d" % i for i in range(RUN_MAX, RUN_MAX + 10)]
    assert (other.method.routing_key, other.bodies) == ("other", [b"last"])


def test_repeated_publish_arguments_share_one_method() -> None:
    server = Server(LIMITS)
    server.feed(client_handshake(channel_max=8, frame_max=4096) + encode_method(1, m.ChannelOpen()))
    out = bytearray()
    for _ in range(2):
        out += encode_method(1, m.BasicPublish(0, "ex", "key.shared"))
        write_content(out, 1, b"\x00\x00", b"body", 4096)
    half = len(out) // 2  # fed apart: two events, not one run
    first, second = server.feed(bytes(out[:half])) + server.feed(bytes(out[half:]))
    assert first.method is second.method
    assert len(server.conn._fastpath._publishes) <= PUBLISHES_MAX


# -- properties: check_properties and decode_properties agree with BasicProperties.decode --------

_NO_DECODE_FLAGS = 0xFFFF & ~protocol._DECODE_FLAGS
utf8_tricky = st.sampled_from(
    [b"", b"a", b"\xc3\xa9", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x82"]
)


@st.composite
def property_blocks(draw: Any) -> bytes:
    """Property blocks: encoded properties (some mutated, cut or extended), and flags words
    without headers/reply-to/expiration over bytes with short strings (valid or not)."""
    if draw(st.booleans()):
        raw = bytearray(draw(basic_properties).encode())
        how = draw(st.sampled_from(["keep", "mutate", "cut", "extend"]))
        if how == "mutate" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        elif how == "cut":
            del raw[draw(st.integers(0, len(raw))) :]
        elif how == "extend":
            raw += draw(st.binary(max_size=4))
        return bytes(raw)
    flags = draw(st.integers(0, 0xFFFF)) & (_NO_DECODE_FLAGS if draw(st.integers(0, 4)) else 0xFFFF)
    tail = bytearray()
    for _ in range(draw(st.integers(0, 12))):
        text = draw(st.one_of(utf8_tricky, st.binary(max_size=5)))
        length = len(text) + draw(st.sampled_from([0, 0, 0, 1, -1, 200]))
        tail.append(max(0, min(length, 255)))
        tail += text
    return struct.pack(">H", flags) + bytes(tail[: draw(st.integers(0, len(tail)))])


@settings(max_examples=400, deadline=None)
@given(property_blocks())
@example(b"")
@example(b"\x80")
@example(b"\x80\x00\x02\xc3\xa9")  # content-type "é"
@example(b"\x80\x00\x01\xff")  # content-type: not UTF-8
@example(b"\x80\x00\x05ab")  # content-type past the end
@example(b"\x00\x01")  # continued flags
@example(b"\x00\x40\x00\x00\x00")  # timestamp past the end
@example(b"\x10\x00")  # delivery-mode past the end
@example(b"\x00\x02")  # an unassigned flag: ignored
def test_check_properties_agrees_with_the_decoder(raw: bytes) -> None:
    check_properties_agrees_with_the_decoder(raw)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(property_blocks())
def test_check_properties_agrees_with_the_decoder_at_length(raw: bytes) -> None:
    check_properties_agrees_with_the_decoder(raw)


def check_properties_agrees_with_the_decoder(raw: bytes) -> None:
    protocol._PROPERTIES.clear()  # from nothing known, then with the memo filled
    for _ in range(2):
        try:
            expected = BasicProperties.decode(memoryview(raw))
        except DecodeError as exc:
            refusal: str | None = str(exc)
        else:
            refusal = None
        if refusal is not None:
            with pytest.raises(DecodeError) as checked:
                check_properties(raw)
            assert str(checked.value) == refusal
            with pytest.raises(DecodeError) as decoded:
                decode_properties(raw)
            assert str(decoded.value) == refusal
            continue
        checked_ok = check_properties(raw)
        assert checked_ok is None or checked_ok == expected
        assert decode_properties(raw) == expected  # never fails once checked
        if expected.headers is None and len(raw) <= protocol._PROPERTIES_KEY_MAX:
            assert check_properties(raw) == expected  # now decoded and memoised
        else:
            assert check_properties(raw) in (None, expected)


@given(field_tables)
def test_properties_with_headers_are_never_shared(headers: dict[str, Any]) -> None:
    raw = BasicProperties(headers=headers, delivery_mode=1).encode()
    first, second = decode_properties(raw), check_properties(raw)
    assert first == second
    assert first is not second  # a headers table is mutable: each message decodes its own
    assert raw not in protocol._PROPERTIES


def test_the_properties_memo_is_bounded() -> None:
    for i in range(protocol._PROPERTIES_MAX + 10):
        raw = BasicProperties(message_id=str(i)).encode()
        assert check_properties(raw) is None
        assert decode_properties(raw) == BasicProperties(message_id=str(i))
        assert len(protocol._PROPERTIES) <= protocol._PROPERTIES_MAX
    assert check_properties(b"\x00\x00" + b"x" * 300) is None
    assert b"\x00\x00" + b"x" * 300 not in protocol._PROPERTIES  # too long to keep


def test_properties_from_a_backend_may_be_any_buffer() -> None:
    raw = BasicProperties(delivery_mode=2).encode()
    assert decode_properties(bytearray(raw)) == decode_properties(memoryview(raw))  # type: ignore[arg-type]
    assert decode_properties(raw) == BasicProperties(delivery_mode=2)


# -- through a broker ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker(BrokerConfig(port=0)) as running:
        yield running


@pytest.fixture
def amqp(broker: RunningBroker) -> Iterator[RawAMQP]:
    with RawAMQP("127.0.0.1", broker.port) as conn:
        conn.handshake()
        conn.open_channel(1)
        yield conn


def publish_raw(amqp: RawAMQP, routing_key: str, properties: bytes, body: bytes) -> None:
    amqp.send(
        encode_method(1, m.BasicPublish(0, "", routing_key))
        + content_header(1, len(body), properties)
        + body_frame(1, body)
    )


@pytest.mark.parametrize(
    "properties",
    [
        b"\x80\x00\x01\xff",  # content-type not UTF-8 (checked without decoding)
        b"\x80\x00\x09text",  # content-type past the end
        b"\x00\x80\x01\xc3",  # message-id: a cut UTF-8 sequence
        b"\x00\x40\x00\x00",  # timestamp past the end
        b"\x00\x01",  # continued flags
        b"\x20\x00\x00\x00\x00\x05\x01kz\x00\x00",  # headers: unknown field type
        b"\x02\x00\x05amq.",  # reply-to past the end
    ],
)
def test_malformed_properties_close_the_connection_before_routing(
    amqp: RawAMQP, properties: bytes
) -> None:
    with pytest.raises(DecodeError) as decoder:
        BasicProperties.decode(memoryview(properties))
    amqp.call(1, m.QueueDeclare(queue="fast.path.bad"), m.QueueDeclareOk)
    publish_raw(amqp, "fast.path.bad", properties, b"body")
    close = amqp.expect_connection_close(501, class_id=60, method_id=40)
    assert close.reply_text == f"FRAME_ERROR - cannot decode properties: {decoder.value}"


def test_properties_checked_without_decoding_reach_consumers_intact(amqp: RawAMQP) -> None:
    queue = "fast.path.lazy"
    amqp.call(1, m.QueueDeclare(queue=queue, arguments={"x-max-priority": 5}), m.QueueDeclareOk)
    sent = []
    for i in range(3):
        props = BasicProperties(
            content_type="application/json", priority=i, message_id=f"m-{i}", timestamp=1000 + i
        ).encode()
        publish_raw(amqp, queue, props, b"%d" % i)
        sent.append((props, b"%d" % i))
    got = []
    for _ in range(3):
        amqp.send_method(1, m.BasicGet(queue=queue, no_ack=True))
        amqp.expect_method(m.BasicGetOk, channel=1)
        got.append(amqp.expect_content(1))
    assert got == sent[::-1]  # by priority: the properties were decoded when needed


def test_direct_reply_to_and_expiration_are_still_checked(amqp: RawAMQP) -> None:
    amqp.call(1, m.QueueDeclare(queue="fast.path.rpc"), m.QueueDeclareOk)
    publish_raw(amqp, "fast.path.rpc", BasicProperties(expiration="-1").encode(), b"x")
    close = amqp.expect_channel_close(1, 406, class_id=60, method_id=40)
    assert close.reply_text.startswith("PRECONDITION_FAILED - invalid expiration '-1': ")
    amqp.open_channel(1)
    publish_raw(
        amqp, "fast.path.rpc", BasicProperties(reply_to="amq.rabbitmq.reply-to").encode(), b"x"
    )
    close = amqp.expect_channel_close(1, 406, class_id=60, method_id=40)
    assert close.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"


def test_cc_and_bcc_headers_still_route(amqp: RawAMQP) -> None:
    for queue in ("fast.path.a", "fast.path.b", "fast.path.c"):
        amqp.call(1, m.QueueDeclare(queue=queue), m.QueueDeclareOk)
    props = BasicProperties(headers={"CC": ["fast.path.b"], "BCC": ["fast.path.c"]}).encode()
    publish_raw(amqp, "fast.path.a", props, b"x")
    for queue in ("fast.path.a", "fast.path.b", "fast.path.c"):
        amqp.send_method(1, m.BasicGet(queue=queue, no_ack=True))
        amqp.expect_method(m.BasicGetOk, channel=1)
        properties, body = amqp.expect_content(1)
        assert body == b"x"
        headers = BasicProperties.decode(memoryview(properties)).headers
        assert headers == {"CC": ["fast.path.b"]}
