"""Fuzz targets of the AMQP side: the frame splitter and content assembly (``ServerConnection``
driven as the server's read loop drives it), the method and field-table codec, content-header
properties, and the SASL responses of ``connection.start-ok``.

Documented errors: ``AMQPError`` and ``BadProtocolHeader`` from ``ServerConnection``;
``DecodeError`` from the codec; ``ValueError`` from ``auth.sasl.parse_response``.
"""

from __future__ import annotations

from typing import Any

import attrs

from tqbroker.auth.sasl import parse_response
from tqbroker.protocol._framing import FRAME_HEAD_SIZE
from tqbroker.protocol.codec import Long, add_long_header, encode_table, read_table, write_table
from tqbroker.protocol.connection import (
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
from tqbroker.protocol.errors import AMQPError, DecodeError
from tqbroker.protocol.frames import PROTOCOL_HEADER, encode_method
from tqbroker.protocol.methods import (
    BasicProperties,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelFlowOk,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ConnectionUpdateSecret,
    ConnectionUpdateSecretOk,
    decode_method,
)
from tqbroker.protocol.properties import check_properties

from .common import Reader, chunkings, target

# Small limits, so that the fuzzer reaches them: a frame limit of 4096 once tuned, messages of
# at most 2048 bytes, 8 channels.
LIMITS = Limits(channel_max=8, frame_max=4096, heartbeat=0, max_message_size=2048)
# A client's handshake up to two open channels: what a fuzzed stream may start with.
HANDSHAKE = b"".join(
    (
        PROTOCOL_HEADER,
        encode_method(0, ConnectionStartOk({}, "PLAIN", "\0guest\0guest", "en_US")),
        encode_method(0, ConnectionTuneOk(8, 4096, 0)),
        encode_method(0, ConnectionOpen("/")),
        encode_method(1, ChannelOpen()),
        encode_method(2, ChannelOpen()),
    )
)
_START = ConnectionStart(0, 9, {}, "PLAIN AMQPLAIN", "en_US")


def drive(chunks: list[bytes], *, eof: bool = True) -> list[tuple[Any, ...]]:
    """Feed ``chunks`` to a ``ServerConnection`` as ``server/connection.py``'s read loop does
    (errors closing the channel or the connection, the handshake answered) and return what
    happened: every event, error and property check, in order."""
    conn = ServerConnection(LIMITS)
    seen: list[tuple[Any, ...]] = []
    budget = sum(len(c) for c in chunks) + 16  # events and errors are at most one per byte
    for chunk in [*chunks, b""] if eof else chunks:
        conn.receive_data(chunk)
        while True:
            budget -= 1
            assert budget >= 0, "next_event made no progress"
            try:
                event = conn.next_event()
            except BadProtocolHeader:
                # Not its text: that quotes the bytes at hand when the mismatch showed.
                seen.append(("bad header",))
                return seen
            except AMQPError as err:
                seen.append(
                    (
                        "error",
                        err.code,
                        err.text,
                        err.channel,
                        err.class_id,
                        err.method_id,
                        err.hard,
                    )
                )
                _fail(conn, err)
                continue
            if event is NEED_DATA:
                # Never more buffered than one frame needs (framing lost: nothing is read).
                held = len(conn._buf) - conn._pos
                assert (
                    conn._broken
                    or held < FRAME_HEAD_SIZE + conn._frame_limit + 1
                    or (conn.state is State.AWAIT_HEADER and held < len(PROTOCOL_HEADER))
                ), f"{held} bytes buffered"
                break
            if isinstance(event, EndOfStream):
                seen.append(("eof",))
                return seen
            seen += _describe(event)
            _answer(conn, event)
            if conn.state is State.CLOSED:
                return seen
    return seen


def _describe(event: object) -> list[tuple[Any, ...]]:
    """What ``event`` says, one entry per publish and its properties' refusal right after it
    (how publishes group into runs depends on the cuts: nothing here may depend on it)."""
    if isinstance(event, ContentReceived):
        assert len(event.properties) == len(event.bodies) > 0
        assert all(len(body) <= LIMITS.max_message_size for body in event.bodies)
        described: list[tuple[Any, ...]] = []
        for properties, body in zip(event.properties, event.bodies, strict=True):
            described.append(("content", event.channel, event.method, properties, body))
            try:
                check_properties(properties)  # as publishing.make_messages does, each publish
            except DecodeError as exc:
                described.append(("bad properties", str(exc)))
        return described
    if isinstance(event, MethodReceived):
        return [("method", event.channel, event.method)]
    assert isinstance(event, ProtocolHeaderReceived), event
    return [("header",)]


def _fail(conn: ServerConnection, err: AMQPError) -> None:
    """What ``server.connection.Connection._fail`` does with the protocol object."""
    if err.hard or not err.channel:
        if conn.state not in (State.CLOSING, State.CLOSED):
            conn.close_connection(err)
        return
    conn.close_channel(err)


def _answer(conn: ServerConnection, event: object) -> None:
    """The server's side of the handshake and of channel opening and closing."""
    if isinstance(event, ProtocolHeaderReceived):
        conn.send_method(0, _START)
        return
    if isinstance(event, ContentReceived):
        return  # its properties are checked by ``_describe``, publish by publish
    assert isinstance(event, MethodReceived)
    method, channel = event.method, event.channel
    reply: Any = None
    if isinstance(method, ConnectionStartOk):
        reply = ConnectionTune(LIMITS.channel_max, LIMITS.frame_max, LIMITS.heartbeat)
    elif isinstance(method, ConnectionOpen):
        reply = ConnectionOpenOk()
    elif isinstance(method, ConnectionClose):
        reply = ConnectionCloseOk()
    elif isinstance(method, ConnectionUpdateSecret):
        reply = ConnectionUpdateSecretOk()
    elif isinstance(method, ChannelOpen):
        reply = ChannelOpenOk()
    elif isinstance(method, ChannelClose):
        reply = ChannelCloseOk()
    elif isinstance(method, ChannelFlow) and conn.channel_is_open(channel):
        reply = ChannelFlowOk(method.active)
    if reply is not None:
        conn.send_method(channel, reply)


@target("frames", max_len=16384)
def fuzz_frames(data: bytes) -> None:
    """Frame splitting and content assembly: only AMQP errors, the same for every chunking."""
    reader = Reader(data)
    flags = reader.byte()
    seed = reader.take(reader.byte() % 16)
    stream = reader.rest()
    if flags & 1:  # start after a valid handshake, on an open connection with channels 1, 2
        stream = HANDSHAKE + stream
    whole = drive([stream] if stream else [])
    chunked = drive(chunkings(stream, seed))
    assert whole == chunked, "the events depend on how the bytes were chunked"
    if flags & 2:  # a byte at a time: the worst case for the buffer
        assert drive(chunkings(stream, b"")) == whole


@target("methods")
def fuzz_methods(data: bytes) -> None:
    """Method frame payloads: ``DecodeError`` only; what decodes re-encodes stably."""
    try:
        method = decode_method(memoryview(data))
    except DecodeError:
        return
    encoded = method.encode()
    again = decode_method(memoryview(encoded))
    assert again.encode() == encoded, "decode(encode(method)) encodes differently"
    assert type(again) is type(method)


@target("tables")
def fuzz_tables(data: bytes) -> None:
    """Field tables: ``DecodeError`` only; what decodes re-encodes stably."""
    try:
        table, end = read_table(memoryview(data), 0)
    except DecodeError:
        return
    assert 4 <= end <= len(data)
    out = bytearray()
    write_table(out, table)
    again, end = read_table(memoryview(bytes(out)), 0)
    assert end == len(out)
    out2 = bytearray()
    write_table(out2, again)
    assert out2 == out, "decode(encode(table)) encodes differently"


@target("properties")
def fuzz_properties(data: bytes) -> None:
    """Content-header properties: ``check_properties`` refuses exactly what
    ``BasicProperties.decode`` refuses; ``add_long_header`` adds exactly one header."""
    decoded = _check_agrees(data)
    if decoded is None:
        return
    if data == decoded.encode():  # a valid block: its cuts are judged alike too
        for end in _cuts(len(data)):
            _check_agrees(data[:end])
    spliced = add_long_header(data, "x-fuzz", -5)
    if spliced is not None:
        headers = dict(decoded.headers or {})
        assert "x-fuzz" not in headers
        result = BasicProperties.decode(memoryview(spliced))
        assert result.headers is not None
        expected = {**headers, "x-fuzz": Long(-5)}
        assert encode_table(result.headers) == encode_table({**headers, "x-fuzz": -5})
        assert attrs.evolve(result, headers=None) == attrs.evolve(decoded, headers=None)
        if decoded.encode() == data:  # our own encoding: exactly what encode() would say
            assert spliced == attrs.evolve(decoded, headers=expected).encode()
    encoded = decoded.encode()
    assert BasicProperties.decode(memoryview(encoded)).encode() == encoded


def _cuts(size: int, edge: int = 48, spread: int = 48) -> list[int]:
    """Where to cut a valid block of ``size`` bytes: every place near its start and end (the
    flags and the last property), and ``spread`` places evenly between -- all of them for a
    small block. (Every cut of a 1 KiB block is a thousand decodes: a slow input by itself.)"""
    if size <= 2 * edge + spread:
        return list(range(size))
    middle = range(edge, size - edge, max(1, (size - 2 * edge) // spread))
    return sorted({*range(edge), *middle, *range(size - edge, size)})


def _check_agrees(data: bytes) -> BasicProperties | None:
    """The decoded properties, or None if refused: by the decoder and check_properties
    alike."""
    try:
        decoded: BasicProperties | None = BasicProperties.decode(memoryview(data))
    except DecodeError:
        decoded = None
    try:
        checked = check_properties(data)
    except DecodeError:
        assert decoded is None, "check_properties refused what the decoder accepts"
        return None
    assert decoded is not None, "check_properties accepted what the decoder refuses"
    assert checked is None or checked.encode() == decoded.encode()  # (NaN != NaN)
    return decoded


MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")


@target("sasl")
def fuzz_sasl(data: bytes) -> None:
    """PLAIN and AMQPLAIN responses: ``ValueError`` only; credentials are valid Unicode text
    (``UserStore.verify`` encodes them)."""
    mechanism = MECHANISMS[data[0] % len(MECHANISMS)] if data else "PLAIN"
    try:
        username, password = parse_response(mechanism, data[1:])
    except ValueError:
        return
    username.encode()
    password.encode()
