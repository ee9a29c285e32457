"""A message's content frames encoded once and reused for its further deliveries
(``encoding.write_deliver``: ``frames.deliver_content`` + ``frames.write_deliver_content``) are
the bytes that ``frames.write_deliver`` writes for each delivery."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqbroker.model import Message
from tqbroker.protocol import frames
from tqbroker.protocol.methods import BasicProperties
from tqbroker.server.encoding import (
    encoded_names,
    write_deliver,
    write_delivers,
    write_encoded_delivers,
)

from .strategies import basic_properties, shortstrs

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

frame_maxes = st.one_of(st.just(0), st.integers(9, 200), st.sampled_from([4096, 131072]))
bodies = st.one_of(st.binary(max_size=300), st.just(b""))
# (channel, consumer tag, delivery tag, redelivered, frame_max): a message's deliveries, on one
# channel number or several, over connections with different frame sizes.
deliveries = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 65535]),
        shortstrs,
        st.integers(1, 2**64 - 1),
        st.booleans(),
        frame_maxes,
    ),
    min_size=1,
    max_size=6,
)


def deliver(out: bytearray, message: Message, delivery: tuple[int, str, int, bool, int]) -> None:
    """What ``Channel._write_deliver`` does."""
    channel, tag, delivery_tag, redelivered, frame_max = delivery
    write_deliver(out, message, channel, frames.shortstr(tag), delivery_tag, redelivered, frame_max)


def reference(message: Message, delivery: tuple[int, str, int, bool, int]) -> bytes:
    """The delivery as the generic encoder writes it, from scratch."""
    channel, tag, delivery_tag, redelivered, frame_max = delivery
    out = bytearray()
    names = frames.shortstr(message.exchange) + frames.shortstr(message.routing_key)
    frames.write_deliver(
        out,
        channel,
        frames.shortstr(tag),
        delivery_tag,
        redelivered,
        names,
        message.properties_raw,
        message.body,
        frame_max,
    )
    return bytes(out)


@SETTINGS
@given(shortstrs, shortstrs, basic_properties, bodies, deliveries)
def test_reused_content_gives_the_same_bytes(
    exchange: str,
    routing_key: str,
    properties: BasicProperties,
    body: bytes,
    sequence: list[tuple[int, str, int, bool, int]],
) -> None:
    raw = properties.encode()
    message = Message(exchange, routing_key, raw, body)
    out = bytearray(b"before")
    expected = bytearray(b"before")
    for delivery in sequence:
        deliver(out, message, delivery)
        expected += reference(message, delivery)
    assert out == expected


@SETTINGS
@given(
    st.lists(st.tuples(shortstrs, shortstrs, bodies, st.booleans()), min_size=1, max_size=5),
    st.sampled_from([1, 2, 65535]),
    shortstrs,
    st.integers(1, 2**63),
    frame_maxes,
    st.integers(1, 3),
)
def test_a_batch_gives_the_same_bytes(
    messages: list[tuple[str, str, bytes, bool]],
    channel: int,
    tag: str,
    first_tag: int,
    frame_max: int,
    rounds: int,
) -> None:
    """``write_delivers`` (a consumer's batch: first deliveries, and from the second round on
    content reused on this channel number) writes what ``frames.write_deliver`` does for each,
    and counts the redelivered ones."""
    raw = BasicProperties(content_type="text/plain").encode()
    batch = [
        (i, Message(exchange, key, raw, body), redelivered)
        for i, (exchange, key, body, redelivered) in enumerate(messages)
    ]
    for round_ in range(rounds):
        out, expected = bytearray(b"before"), bytearray(b"before")
        start = first_tag + round_ * len(batch)
        count = write_delivers(out, channel, frames.shortstr(tag), start, batch, frame_max)
        for offset, (_id, message, redelivered) in enumerate(batch):
            delivery = (channel, tag, start + offset, redelivered, frame_max)
            expected += reference(message, delivery)
        assert out == expected
        assert count == sum(redelivered for _id, _m, redelivered in batch)


@SETTINGS
@given(
    st.lists(st.tuples(shortstrs, shortstrs, basic_properties, bodies), min_size=1, max_size=5),
    st.sampled_from([1, 2, 65535]),
    shortstrs,
    st.integers(1, 2**63),
    frame_maxes,
)
def test_encoded_parts_give_the_same_bytes(
    messages: list[tuple[str, str, BasicProperties, bytes]],
    channel: int,
    tag: str,
    first_tag: int,
    frame_max: int,
) -> None:
    """``write_encoded_delivers`` (a stream's records as they lie in its log: names, properties
    and a view of the body) writes what ``frames.write_deliver`` does for each."""
    batch: list[tuple[int, bytes, bytes, bytes | memoryview]] = [
        (
            i,
            frames.shortstr(exchange) + frames.shortstr(key),
            properties.encode(),
            memoryview(b"<" + body + b">")[1:-1],
        )
        for i, (exchange, key, properties, body) in enumerate(messages)
    ]
    out, expected = bytearray(b"before"), bytearray(b"before")
    write_encoded_delivers(out, channel, frames.shortstr(tag), first_tag, batch, frame_max)
    for i, (exchange, key, properties, body) in enumerate(messages):
        message = Message(exchange, key, properties.encode(), body)
        expected += reference(message, (channel, tag, first_tag + i, False, frame_max))
    assert out == expected


def test_content_is_kept_from_the_second_delivery_for_one_channel() -> None:
    message = Message("ex", "rk", b"\x10\x00\x01", b"x" * 100)
    out = bytearray()
    tag = frames.shortstr("c")
    write_deliver(out, message, 1, tag, 1, False, 4096)  # the first delivery: names only
    assert message.delivery_cache == b"\x02ex\x02rk"
    assert encoded_names(message) == b"\x02ex\x02rk"
    write_deliver(out, message, 1, tag, 2, False, 4096)
    kept = message.delivery_cache
    assert isinstance(kept, tuple)
    assert kept[0] == 1
    write_deliver(out, message, 1, tag, 3, True, 0)
    assert message.delivery_cache is kept  # reused
    write_deliver(out, message, 2, tag, 4, False, 4096)  # another channel number: replaces it
    assert isinstance(message.delivery_cache, tuple)
    assert message.delivery_cache[0] == 2
    write_deliver(out, message, 2, tag, 5, False, 100)  # several body frames: in full
    assert message.delivery_cache[0] == 2
    assert encoded_names(message) == b"\x02ex\x02rk"
    empty = Message("ex", "rk", b"\x00\x00", b"")
    for _ in range(3):  # an empty body has no body frame: always in full
        write_deliver(out, empty, 1, tag, 6, False, 4096)
    assert empty.delivery_cache == b"\x02ex\x02rk"
