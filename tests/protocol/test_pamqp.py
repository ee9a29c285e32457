"""Cross-checks against pamqp, an independent AMQP 0-9-1 codec.

Both directions: what we encode, pamqp decodes to the same values; what pamqp encodes, we decode
(through ``decode_method`` and through a whole ``ServerConnection``) to the same values. Values
are drawn from the part of the domain both libraries represent the same way: pamqp decodes
``longlong`` as signed, reads timestamps above 2**32 as milliseconds, encodes table floats as
32-bit ``f`` and byte strings only from ``bytearray``, and validates some names on encode.
"""

from __future__ import annotations

import datetime
import struct
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands as pc
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from tqbroker.protocol import methods as m
from tqbroker.protocol.connection import (
    NEED_DATA,
    ContentReceived,
    MethodReceived,
    ProtocolHeaderReceived,
    ServerConnection,
    State,
)
from tqbroker.protocol.frames import encode_method, write_content
from tqbroker.protocol.methods import BasicProperties, decode_method

from .strategies import (
    EPOCH,
    PROPERTY_FIELDS,
    UTC,
    WIRE_FIELDS,
    canonical,
    decimals,
    method_fields,
    shortstrs,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# pamqp spells two names differently
PAMQP_NAMES = {"type": "exchange_type"}
PAMQP_PROPERTY_NAMES = {"type": "message_type"}

# The representative set the brief asks for, plus everything else pamqp knows
# (pamqp has no access.* class).
REPRESENTATIVE = [
    m.ConnectionStart,
    m.ConnectionStartOk,
    m.ConnectionTune,
    m.ConnectionTuneOk,
    m.ConnectionOpen,
    m.ConnectionClose,
    m.ChannelOpen,
    m.ChannelClose,
    m.ExchangeDeclare,
    m.ExchangeBind,
    m.QueueDeclare,
    m.QueueBind,
    m.QueueDeclareOk,
    m.BasicQos,
    m.BasicConsume,
    m.BasicPublish,
    m.BasicDeliver,
    m.BasicGetOk,
    m.BasicAck,
    m.BasicNack,
    m.BasicReject,
    m.BasicCancel,
    m.ConfirmSelect,
    m.TxSelect,
    m.TxSelectOk,
    m.TxCommit,
    m.TxCommitOk,
    m.TxRollback,
    m.TxRollbackOk,
]
SHARED = sorted(
    (cls for cls in m.METHODS.values() if cls.INDEX in pc.INDEX_MAPPING), key=lambda c: c.INDEX
)


def test_pamqp_knows_every_method_but_access() -> None:
    assert {cls.NAME for cls in m.METHODS.values() if cls not in SHARED} == {
        "access.request",
        "access.request-ok",
    }
    assert set(REPRESENTATIVE) <= set(SHARED)
    for cls in SHARED:
        pamqp_cls: Any = pc.INDEX_MAPPING[cls.INDEX]
        assert [PAMQP_NAMES.get(name, name) for name, _ in WIRE_FIELDS[cls]] == list(
            pamqp_cls.__slots__
        )
        assert [pamqp_cls.amqp_type(PAMQP_NAMES.get(n, n)) for n, _ in WIRE_FIELDS[cls]] == [
            wire for _, wire in WIRE_FIELDS[cls]
        ]


def ids(cls: type[m.Method]) -> str:
    return cls.NAME


# -- value domains --------------------------------------------------------------------------------

pamqp_timestamps = st.integers(0, 2**32 - 1)
pamqp_datetimes = pamqp_timestamps.map(lambda s: EPOCH + datetime.timedelta(seconds=s))
keys = st.text(max_size=20)


def tables(floats: st.SearchStrategy[float], binary: st.SearchStrategy[Any]) -> Any:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        floats,
        decimals,
        st.text(max_size=30),
        binary,
        pamqp_datetimes,
    )
    values = st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=3), st.dictionaries(keys, children, max_size=3)
        ),
        max_leaves=8,
    )
    return st.dictionaries(keys, values, max_size=4)


# What we encode and pamqp decodes faithfully.
ours_tables = tables(st.floats(allow_nan=False), st.binary(max_size=20))
# What pamqp encodes and we decode faithfully (pamqp writes floats as 32-bit "f").
pamqp_tables = tables(st.floats(allow_nan=False, width=32), st.binary(max_size=20).map(bytearray))

INT_WIRES = {
    "octet": st.integers(0, 255),
    "short": st.integers(0, 65535),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**63 - 1),
    "timestamp": pamqp_timestamps,
}
# pamqp's validate() pins these on encode
PAMQP_FIXED = {
    "ticket": 0,
    "capabilities": "",
    "insist": False,
    "known_hosts": "",
    "out_of_band": "0",
    "channel_id": "0",
    "cluster_id": "",
}
PAMQP_NAME_FIELDS = {"exchange", "queue", "destination", "source"}
amqp_names = st.text(alphabet="abcXYZ0189-_.:@#,/+ ", max_size=127)


def field_strategy(name: str, wire: str, *, for_pamqp: bool) -> st.SearchStrategy[Any]:
    if for_pamqp and name in PAMQP_FIXED:
        return st.just(PAMQP_FIXED[name])
    if wire in INT_WIRES:
        return INT_WIRES[wire]
    if wire == "bit":
        return st.booleans()
    if wire == "shortstr":
        if for_pamqp and name in PAMQP_NAME_FIELDS:
            return amqp_names
        if for_pamqp and name == "virtual_host":
            return shortstrs.map(lambda s: s[:127])
        return shortstrs
    if wire == "longstr":
        return st.text(max_size=100)
    assert wire == "table"
    return pamqp_tables if for_pamqp else ours_tables


def kwargs_for(cls: type[m.Method], *, for_pamqp: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {name: field_strategy(name, wire, for_pamqp=for_pamqp) for name, wire in WIRE_FIELDS[cls]}
    )


def pamqp_value(value: Any) -> Any:
    """pamqp's decoded form of one of our values, for comparison."""
    return canonical(value) if isinstance(value, dict) else value


def make_pamqp(cls: type[m.Method], kwargs: dict[str, Any]) -> Any:
    pamqp_cls = pc.INDEX_MAPPING[cls.INDEX]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # basic.recover-async
        return pamqp_cls(**{PAMQP_NAMES.get(k, k): v for k, v in kwargs.items()})


def pamqp_unmarshal(data: bytes) -> tuple[int, int, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # basic.recover-async
        return pamqp_frame.unmarshal(data)


def split_frame(data: bytes) -> tuple[int, int, bytes]:
    kind, channel, size = struct.unpack_from(">BHI", data)
    assert len(data) == 8 + size
    assert data[-1] == 0xCE
    return kind, channel, data[7:-1]


# -- ours -> pamqp --------------------------------------------------------------------------------


def check_ours_to_pamqp(cls: type[m.Method], kwargs: dict[str, Any], channel: int) -> None:
    ours = cls(**kwargs)
    data = encode_method(channel, ours)
    consumed, got_channel, theirs = pamqp_unmarshal(data)
    assert (consumed, got_channel) == (len(data), channel)
    assert type(theirs) is pc.INDEX_MAPPING[cls.INDEX]
    for name, wire in WIRE_FIELDS[cls]:
        value = getattr(theirs, PAMQP_NAMES.get(name, name))
        if wire == "table":
            assert canonical(value) == canonical(kwargs[name]), name
        else:
            assert value == kwargs[name], name


@pytest.mark.parametrize("cls", SHARED, ids=ids)
@SETTINGS
@given(data=st.data())
def test_pamqp_decodes_what_we_encode(cls: type[m.Method], data: Any) -> None:
    kwargs = data.draw(kwargs_for(cls, for_pamqp=False))
    check_ours_to_pamqp(cls, kwargs, data.draw(st.integers(0, 65535)))


# -- pamqp -> ours --------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", SHARED, ids=ids)
@SETTINGS
@given(data=st.data())
def test_we_decode_what_pamqp_encodes(cls: type[m.Method], data: Any) -> None:
    kwargs = data.draw(kwargs_for(cls, for_pamqp=True))
    channel = data.draw(st.integers(0, 65535))
    raw = pamqp_frame.marshal(make_pamqp(cls, kwargs), channel)
    kind, got_channel, payload = split_frame(raw)
    assert (kind, got_channel) == (1, channel)
    decoded = decode_method(memoryview(payload))
    assert type(decoded) is cls
    assert canonical(method_fields(decoded)) == canonical(kwargs)
    # and pamqp's bytes are exactly ours (tables aside: pamqp sorts keys and packs integers
    # into the smallest type)
    if not any(wire == "table" for _, wire in WIRE_FIELDS[cls]):
        assert raw == encode_method(channel, cls(**kwargs))


def pamqp_client_handshake() -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        parts: list[Any] = [
            pamqp_header.ProtocolHeader(),
            pc.Connection.StartOk(
                client_properties={"product": "pamqp", "capabilities": {"basic.nack": True}},
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
            pc.Connection.TuneOk(channel_max=2047, frame_max=4096, heartbeat=60),
            pc.Connection.Open(virtual_host="/"),
            pc.Channel.Open(),
        ]
    return b"".join(pamqp_frame.marshal(part, 1 if isinstance(part, pc.Channel.Open) else 0)
                    for part in parts)  # fmt: skip


def drive(conn: ServerConnection, data: bytes) -> list[Any]:
    conn.receive_data(data)
    events = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if isinstance(event, ProtocolHeaderReceived):
            conn.send_method(0, m.ConnectionStart(0, 9, {}, "PLAIN", "en_US"))
        elif isinstance(event, MethodReceived) and isinstance(event.method, m.ConnectionStartOk):
            conn.send_method(0, m.ConnectionTune(2047, 131072, 60))
        elif isinstance(event, MethodReceived) and isinstance(event.method, m.ConnectionOpen):
            conn.send_method(0, m.ConnectionOpenOk())
    return events


def test_a_pamqp_client_session_through_server_connection() -> None:
    conn = ServerConnection()
    events = drive(conn, pamqp_client_handshake())
    assert conn.state is State.OPEN
    assert conn.frame_max == 4096
    assert [type(e.method) for e in events[1:]] == [
        m.ConnectionStartOk,
        m.ConnectionTuneOk,
        m.ConnectionOpen,
        m.ChannelOpen,
    ]
    assert events[1].method.client_properties == {
        "product": "pamqp",
        "capabilities": {"basic.nack": True},
    }
    assert events[1].method.response == "\0guest\0guest"

    props = pc.Basic.Properties(
        content_type="application/json",
        headers={"retries": 3, "trace": [1, "a", None]},
        delivery_mode=2,
        correlation_id="c-1",
        timestamp=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        message_type="order",
    )
    body = bytes(range(256)) * 40  # over several 4096-byte frames
    client: list[tuple[Any, int]] = [
        (pc.Confirm.Select(), 1),
        (pc.Tx.Select(), 1),
        (pc.Basic.Qos(prefetch_size=0, prefetch_count=10), 1),
        (pc.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 10}), 1),
        (pc.Queue.Bind(queue="q", exchange="amq.topic", routing_key="a.*"), 1),
        (pc.Exchange.Declare(exchange="e", exchange_type="topic"), 1),
        (pc.Basic.Consume(queue="q", consumer_tag="ct"), 1),
        (pc.Basic.Publish(exchange="amq.topic", routing_key="a.b", mandatory=True), 1),
        (pamqp_header.ContentHeader(0, len(body), props), 1),
    ]
    client += [(pamqp_body.ContentBody(body[i : i + 4088]), 1) for i in range(0, len(body), 4088)]
    client += [
        (pc.Basic.Ack(delivery_tag=7, multiple=True), 1),
        (pc.Basic.Nack(delivery_tag=8, requeue=False), 1),
        (pc.Basic.Reject(delivery_tag=9, requeue=True), 1),
        (pc.Basic.Cancel(consumer_tag="ct"), 1),
        (pc.Tx.Commit(), 1),
        (pc.Tx.Rollback(), 1),
        (pc.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1),
        (pc.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0),
    ]
    data = b"".join(pamqp_frame.marshal(value, channel) for value, channel in client)
    events = drive(conn, data)
    names = [e.method.NAME for e in events]
    assert names == [
        "confirm.select",
        "tx.select",
        "basic.qos",
        "queue.declare",
        "queue.bind",
        "exchange.declare",
        "basic.consume",
        "basic.publish",
        "basic.ack",
        "basic.nack",
        "basic.reject",
        "basic.cancel",
        "tx.commit",
        "tx.rollback",
        "channel.close",
        "connection.close",
    ]
    content = events[7]
    assert isinstance(content, ContentReceived)
    assert content.bodies == [body]
    assert content.method == m.BasicPublish(0, "amq.topic", "a.b", True, False)
    decoded = BasicProperties.decode(memoryview(content.properties[0]))
    assert decoded == BasicProperties(
        content_type="application/json",
        headers={"retries": 3, "trace": [1, "a", None]},
        delivery_mode=2,
        correlation_id="c-1",
        timestamp=int(datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()),
        type="order",
    )
    assert events[3].method.arguments == {"x-max-length": 10}
    assert events[5].method.type == "topic"
    assert events[8].method == m.BasicAck(7, True)
    assert events[9].method == m.BasicNack(8, False, False)


# -- content header properties --------------------------------------------------------------------


def property_strategy(wire: str, *, for_pamqp: bool) -> st.SearchStrategy[Any]:
    if wire == "timestamp":
        return pamqp_timestamps
    if wire == "octet":
        return st.integers(0, 255)
    if wire == "table":
        return pamqp_tables if for_pamqp else ours_tables
    assert wire == "shortstr"
    return shortstrs.filter(bool) if for_pamqp else shortstrs


ours_properties = st.fixed_dictionaries(
    {},
    optional={name: property_strategy(wire, for_pamqp=False) for name, wire in PROPERTY_FIELDS},
)
pamqp_properties = st.fixed_dictionaries(
    {},
    optional={
        name: st.sampled_from([1, 2]) if name == "delivery_mode"
        else property_strategy(wire, for_pamqp=True)
        for name, wire in PROPERTY_FIELDS
        if name != "cluster_id"  # pamqp insists it is empty
    },
)  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ours_properties, st.integers(0, 2**63 - 1), st.integers(1, 65535))
def test_pamqp_decodes_our_content_header(
    props: dict[str, Any], body_size: int, channel: int
) -> None:
    out = bytearray()
    write_content(out, channel, BasicProperties(**props).encode(), b"", 4096)
    # write_content only writes the header frame for an empty body; patch in the size
    struct.pack_into(">Q", out, 7 + 4, body_size)
    consumed, got_channel, header = pamqp_unmarshal(bytes(out))
    assert (consumed, got_channel) == (len(out), channel)
    assert isinstance(header, pamqp_header.ContentHeader)
    assert (header.class_id, header.weight, header.body_size) == (60, 0, body_size)  # type: ignore[comparison-overlap]  # pamqp types class_id as None
    for name, wire in PROPERTY_FIELDS:
        theirs = getattr(header.properties, PAMQP_PROPERTY_NAMES.get(name, name))
        ours = props.get(name)
        if name == "cluster_id" and ours is None:
            assert theirs == ""  # pamqp's default
        elif ours is None:
            assert theirs is None, name
        elif wire == "timestamp":
            assert theirs == EPOCH + datetime.timedelta(seconds=ours)
        elif wire == "table":
            assert canonical(theirs) == canonical(ours)
        else:
            assert theirs == ours, name


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pamqp_properties, st.binary(max_size=50))
def test_we_decode_pamqp_content_headers(props: dict[str, Any], body: bytes) -> None:
    pamqp_kwargs = {PAMQP_PROPERTY_NAMES.get(k, k): v for k, v in props.items()}
    if "timestamp" in pamqp_kwargs:
        pamqp_kwargs["timestamp"] = EPOCH + datetime.timedelta(seconds=props["timestamp"])
    header = pamqp_header.ContentHeader(0, len(body), pc.Basic.Properties(**pamqp_kwargs))

    conn = ServerConnection()
    drive(conn, pamqp_client_handshake())
    data = pamqp_frame.marshal(pc.Basic.Publish(exchange="x", routing_key="k"), 1)
    data += pamqp_frame.marshal(header, 1)
    if body:
        data += pamqp_frame.marshal(pamqp_body.ContentBody(body), 1)
    [event] = drive(conn, data)
    assert isinstance(event, ContentReceived)
    assert event.bodies == [body]
    decoded = BasicProperties.decode(memoryview(event.properties[0]))
    assert canonical(
        {k: v for k, v in method_fields(decoded).items() if v is not None}
    ) == canonical(props)
    # and our encoding of the same properties is byte for byte pamqp's (tables aside)
    if "headers" not in props:
        assert BasicProperties(**props).encode() == pc.Basic.Properties(**pamqp_kwargs).marshal()
