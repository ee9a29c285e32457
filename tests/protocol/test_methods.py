"""The generated method classes and ``BasicProperties``: round trips of every method, layout."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqbroker.protocol import methods
from tqbroker.protocol.errors import DecodeError, UnknownMethodError
from tqbroker.protocol.frames import encode_method
from tqbroker.protocol.methods import METHODS, BasicProperties, decode_method

from .strategies import (
    ALL_METHOD_CLASSES,
    PROPERTY_FIELDS,
    WIRE_FIELDS,
    basic_properties,
    canonical,
    method_fields,
    method_instances,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ids(cls: type[methods.Method]) -> str:
    return cls.NAME


def assert_same_method(decoded: methods.Method, original: methods.Method) -> None:
    assert type(decoded) is type(original)
    assert decoded == original
    assert canonical(method_fields(decoded)) == canonical(method_fields(original))


# -- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_METHOD_CLASSES, ids=ids)
@SETTINGS
@given(data=st.data())
def test_every_method_round_trips(cls: type[methods.Method], data: Any) -> None:
    method = data.draw(method_instances(cls))
    payload = method.encode()
    assert payload[:4] == struct.pack(">HH", cls.CLASS_ID, cls.METHOD_ID)
    assert_same_method(decode_method(memoryview(payload)), method)
    # the frame encoder carries the very same payload
    channel = data.draw(st.integers(0, 65535))
    frame = encode_method(channel, method)
    assert frame == struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


@pytest.mark.parametrize("cls", ALL_METHOD_CLASSES, ids=ids)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_truncation_of_a_method_raises_decode_error(
    cls: type[methods.Method], data: Any
) -> None:
    payload = data.draw(method_instances(cls)).encode()
    cut = data.draw(st.integers(0, len(payload) - 1)) if len(payload) > 4 else 3
    with pytest.raises(DecodeError, match=f"cannot decode {cls.NAME}|shorter than its"):
        decode_method(memoryview(payload[:cut]))


@pytest.mark.parametrize("cls", ALL_METHOD_CLASSES, ids=ids)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), junk=st.binary(min_size=1, max_size=8))
def test_bytes_after_the_arguments_raise_decode_error(
    cls: type[methods.Method], data: Any, junk: bytes
) -> None:
    """RabbitMQ's generated decoder matches the whole payload: leftovers are a frame error."""
    payload = data.draw(method_instances(cls)).encode()
    with pytest.raises(DecodeError, match=f"cannot decode {cls.NAME}"):
        decode_method(memoryview(payload + junk))


@pytest.mark.parametrize("cls", ALL_METHOD_CLASSES, ids=ids)
@settings(max_examples=30, deadline=None)
@given(garbage=st.binary(max_size=40))
def test_random_arguments_only_ever_raise_decode_error(
    cls: type[methods.Method], garbage: bytes
) -> None:
    payload = struct.pack(">I", cls.INDEX) + garbage
    try:
        method = decode_method(memoryview(payload))
    except DecodeError:
        return
    assert type(method) is cls


def test_defaults_round_trip() -> None:
    for cls in ALL_METHOD_CLASSES:
        method = cls()
        assert_same_method(decode_method(memoryview(method.encode())), method)


# -- the generated module follows the spec --------------------------------------------------------


def test_methods_table_matches_the_spec() -> None:
    assert set(WIRE_FIELDS) == set(METHODS.values())
    for index, cls in METHODS.items():
        assert index == cls.INDEX == (cls.CLASS_ID << 16) | cls.METHOD_ID
        wire_names = [name for name, _ in WIRE_FIELDS[cls]]
        assert attrs.has(cls)
        assert [f.name for f in attrs.fields(cls)] == wire_names
        assert issubclass(cls, methods.Method)


@pytest.mark.parametrize(
    ("cls", "class_id", "method_id", "name", "has_content"),
    [
        (methods.ConnectionStart, 10, 10, "connection.start", False),
        (methods.ConnectionStartOk, 10, 11, "connection.start-ok", False),
        (methods.ConnectionTuneOk, 10, 31, "connection.tune-ok", False),
        (methods.ConnectionClose, 10, 50, "connection.close", False),
        (methods.ConnectionBlocked, 10, 60, "connection.blocked", False),
        (methods.ConnectionUpdateSecretOk, 10, 71, "connection.update-secret-ok", False),
        (methods.ChannelOpen, 20, 10, "channel.open", False),
        (methods.ChannelCloseOk, 20, 41, "channel.close-ok", False),
        (methods.AccessRequestOk, 30, 11, "access.request-ok", False),
        (methods.ExchangeBind, 40, 30, "exchange.bind", False),
        (methods.ExchangeUnbindOk, 40, 51, "exchange.unbind-ok", False),  # RabbitMQ's 51
        (methods.QueueUnbindOk, 50, 51, "queue.unbind-ok", False),
        (methods.BasicPublish, 60, 40, "basic.publish", True),
        (methods.BasicReturn, 60, 50, "basic.return", True),
        (methods.BasicDeliver, 60, 60, "basic.deliver", True),
        (methods.BasicGetOk, 60, 71, "basic.get-ok", True),
        (methods.BasicRecoverAsync, 60, 100, "basic.recover-async", False),
        (methods.BasicNack, 60, 120, "basic.nack", False),
        (methods.ConfirmSelect, 85, 10, "confirm.select", False),
        (methods.TxRollbackOk, 90, 31, "tx.rollback-ok", False),
    ],
)
def test_method_identities(
    cls: type[methods.Method], class_id: int, method_id: int, name: str, has_content: bool
) -> None:
    assert (
        class_id,
        method_id,
        name,
        has_content,
    ) == (cls.CLASS_ID, cls.METHOD_ID, cls.NAME, cls.HAS_CONTENT)


def test_only_the_four_content_methods_carry_content() -> None:
    assert {cls.NAME for cls in ALL_METHOD_CLASSES if cls.HAS_CONTENT} == {
        "basic.publish",
        "basic.return",
        "basic.deliver",
        "basic.get-ok",
    }


# -- exact layouts --------------------------------------------------------------------------------


def test_bits_share_octets_in_field_order() -> None:
    declare = methods.ExchangeDeclare(
        ticket=0, exchange="x", type="topic", passive=False, durable=True, auto_delete=False,
        internal=True, nowait=True, arguments={},
    )  # fmt: skip
    assert declare.encode() == (
        b"\x00\x28\x00\x0a" + b"\x00\x00" + b"\x01x" + b"\x05topic" + bytes([0b11010]) + b"\0" * 4
    )
    nack = methods.BasicNack(delivery_tag=7, multiple=False, requeue=True)
    assert nack.encode() == b"\x00\x3c\x00\x78" + struct.pack(">Q", 7) + bytes([0b10])
    request = methods.AccessRequest("/data", True, False, True, False, True)
    assert request.encode()[-1] == 0b10101
    deliver = methods.BasicDeliver("ctag", 2**64 - 1, True, "ex", "rk")
    assert deliver.encode() == (
        b"\x00\x3c\x00\x3c\x04ctag" + b"\xff" * 8 + b"\x01" + b"\x02ex" + b"\x02rk"
    )
    qos = methods.BasicQos(prefetch_size=0, prefetch_count=10, global_=True)
    assert qos.encode() == b"\x00\x3c\x00\x0a" + b"\0\0\0\0" + b"\x00\x0a" + b"\x01"


def test_bits_separated_by_other_fields_take_separate_octets() -> None:
    # basic.get-ok: delivery_tag, redelivered (bit), exchange, routing_key, message_count
    get_ok = methods.BasicGetOk(1, True, "", "", 3)
    assert get_ok.encode() == b"\x00\x3c\x00\x47" + struct.pack(">QB", 1, 1) + b"\0\0" + b"\0\0\0\3"


def test_decoding_ignores_undefined_bits() -> None:
    payload = b"\x00\x3c\x00\x50" + struct.pack(">Q", 9) + b"\xfe"  # basic.ack, multiple clear
    assert decode_method(memoryview(payload)) == methods.BasicAck(9, False)


@pytest.mark.parametrize(
    "method",
    [
        methods.BasicPublish(exchange="e" * 256),
        methods.QueueDeclare(queue="\u00e9" * 128),
        methods.ConnectionTune(channel_max=2**16),
        methods.BasicAck(delivery_tag=2**64),
        methods.BasicAck(delivery_tag=-1),
        methods.ConnectionStart(version_major=256),
    ],
)
def test_out_of_range_fields_refuse_to_encode(method: methods.Method) -> None:
    with pytest.raises((ValueError, struct.error)):
        method.encode()


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x00\x3c\x00"])
def test_payload_shorter_than_the_ids(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_method(memoryview(payload))


@pytest.mark.parametrize(
    "index", [0, 0x000A0000, 0x000A0034, 0x003C0029, 0x003C0079, 0x00550001, 0xFFFFFFFF]
)
def test_unknown_method_ids(index: int) -> None:
    with pytest.raises(UnknownMethodError):
        decode_method(memoryview(struct.pack(">I", index) + b"\0" * 16))


def test_invalid_utf8_in_a_shortstr_field_is_a_decode_error() -> None:
    payload = b"\x00\x3c\x00\x28\x00\x00\x02\xff\xfe\x00\x00"  # basic.publish, bad exchange
    with pytest.raises(DecodeError):
        decode_method(memoryview(payload))


def test_longstr_fields_keep_invalid_utf8() -> None:
    payload = b"\x00\x0a\x00\x15" + b"\x00\x00\x00\x03\x00\xff\x00"  # connection.secure-ok
    method = decode_method(memoryview(payload))
    assert isinstance(method, methods.ConnectionSecureOk)
    assert method.response.encode("utf-8", "surrogateescape") == b"\x00\xff\x00"
    assert method.encode() == payload


# -- BasicProperties ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(basic_properties)
def test_basic_properties_round_trip(props: BasicProperties) -> None:
    raw = props.encode()
    decoded = BasicProperties.decode(memoryview(raw))
    assert decoded == props
    assert canonical(attrs.asdict(decoded, recurse=False)) == canonical(
        attrs.asdict(props, recurse=False)
    )
    (flags,) = struct.unpack_from(">H", raw)
    present = [getattr(props, name) is not None for name, _ in PROPERTY_FIELDS]
    assert flags == sum(1 << (15 - i) for i, p in enumerate(present) if p)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(basic_properties, st.data())
def test_truncated_basic_properties_raise_decode_error(props: BasicProperties, data: Any) -> None:
    raw = props.encode()
    if raw == b"\0\0":
        return
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        BasicProperties.decode(memoryview(raw[:cut]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_random_properties_only_ever_raise_decode_error(raw: bytes) -> None:
    with contextlib.suppress(DecodeError):
        BasicProperties.decode(memoryview(raw))


def test_basic_properties_exact_bytes() -> None:
    assert BasicProperties().encode() == b"\x00\x00"
    assert BasicProperties(content_type="text/plain").encode() == b"\x80\x00\x0atext/plain"
    assert BasicProperties(delivery_mode=2, priority=5).encode() == b"\x18\x00\x02\x05"
    assert BasicProperties(timestamp=1).encode() == b"\x00\x40" + struct.pack(">Q", 1)
    assert BasicProperties(cluster_id="c").encode() == b"\x00\x04\x01c"
    assert BasicProperties(headers={}).encode() == b"\x20\x00\x00\x00\x00\x00"
    values: list[Any] = ["x", "y", {"a": 1}, 1, 2] + ["s"] * 4 + [3] + ["t"] * 4
    full = BasicProperties(*values)
    assert full.encode()[:2] == b"\xff\xfc"


def test_properties_reject_continued_flags() -> None:
    with pytest.raises(DecodeError, match="continued"):
        BasicProperties.decode(memoryview(b"\x00\x01\x00\x00"))


def test_properties_order_follows_the_spec() -> None:
    assert [name for name, _ in PROPERTY_FIELDS] == [
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    ]
    assert [f.name for f in attrs.fields(BasicProperties)] == [n for n, _ in PROPERTY_FIELDS]
