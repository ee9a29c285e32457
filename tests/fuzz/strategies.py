"""Hypothesis strategies of fuzz-target inputs: for each target, arbitrary bytes and inputs
built from valid values (the protocol strategies of ``tests/protocol/strategies.py``), then
mutated as a fuzzer would (bits flipped, bytes cut, inserted, repeated). Each draws the very
bytes the target takes, so a failing example replays with ``python -m tests.fuzz.run``.
"""

from __future__ import annotations

import json
import struct
import tempfile
from array import array
from pathlib import Path
from typing import Any

import attrs
from hypothesis import strategies as st

from tqbroker.backends.log.format import encode_batch, encode_record
from tqbroker.backends.log.segment import Segment, segment_name
from tqbroker.model import Message
from tqbroker.protocol import methods
from tqbroker.protocol.codec import encode_table
from tqbroker.protocol.frames import FRAME_BODY, FRAME_HEAD, FRAME_HEADER, HEARTBEAT_FRAME
from tqbroker.protocol.frames import encode_method as encode_frame
from tqbroker.recordbatch import BinaryColumn, ReadBatch, WriteBatch, encode_read, encode_write
from tqbroker.storage_env import StorageEnv
from tqbroker.storage_env.filecache import Directory

from ..protocol.strategies import any_method, basic_properties, field_tables, method_instances
from .amqp_targets import LIMITS


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """``base``'s bytes, perhaps damaged by a few of a fuzzer's mutations."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["flip", "cut", "trim", "insert", "delete", "repeat", "set"]))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and at < len(data):
            data[at] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xCE, 0xFF]))
        elif op == "cut":
            del data[at:]
        elif op == "trim":  # the last bytes: what a length just past the end looks like
            del data[len(data) - draw(st.integers(1, 3)) :]
        elif op == "insert":
            data[at:at] = draw(st.binary(max_size=16))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif op == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 64))]
    return bytes(data)


def _framed(*parts: bytes) -> bytes:
    """The ``common.Reader.parts`` layout: each part but the last with a u16 length."""
    head = b"".join(struct.pack(">H", len(p)) + p for p in parts[:-1])
    return head + parts[-1]


# -- AMQP -----------------------------------------------------------------------------------------

# What a client sends on an open channel: anything but the connection and channel classes and
# the content methods.
CLIENT_METHODS = [
    cls
    for cls in methods.METHODS.values()
    if cls.CLASS_ID not in (methods.CONNECTION_CLASS_ID, methods.CHANNEL_CLASS_ID)
    and not cls.HAS_CONTENT
]
client_methods = st.sampled_from(CLIENT_METHODS).flatmap(method_instances)
_FRAME_ROOM = LIMITS.frame_max - 8


def content_frames(channel: int, properties: bytes, body: bytes, step: int) -> bytes:
    head = struct.pack(">HHQ", 60, 0, len(body)) + properties
    out = FRAME_HEAD.pack(FRAME_HEADER, channel, len(head)) + head + b"\xce"
    for start in range(0, len(body), step):
        part = body[start : start + step]
        out += FRAME_HEAD.pack(FRAME_BODY, channel, len(part)) + part + b"\xce"
    return out


@st.composite
def client_item(draw: st.DrawFn) -> tuple[bytes, tuple[Any, ...] | None]:
    """One thing a valid client sends on channel 1 or 2 of an open connection, and the event
    it is (None: no event, a heartbeat)."""
    channel = draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["method", "publish", "publish", "heartbeat"]))
    if kind == "heartbeat":
        return HEARTBEAT_FRAME, None
    if kind == "method":
        method = draw(client_methods.filter(lambda m: len(m.encode()) <= _FRAME_ROOM))
        return encode_frame(channel, method), ("method", channel, method)
    publish = draw(
        method_instances(methods.BasicPublish).filter(lambda m: len(m.encode()) <= _FRAME_ROOM)
    )
    properties = draw(
        basic_properties.map(lambda p: p.encode()).filter(lambda p: len(p) <= _FRAME_ROOM - 12)
    )
    body = draw(st.binary(max_size=LIMITS.max_message_size))
    step = draw(st.integers(1, _FRAME_ROOM))
    frames = encode_frame(channel, publish) + content_frames(channel, properties, body, step)
    return frames, ("content", channel, publish, properties, body)


client_streams = st.lists(client_item(), max_size=8)


@st.composite
def frame_inputs(draw: st.DrawFn) -> bytes:
    """The ``frames`` target's input: flags, chunk sizes, a client stream (mutated)."""
    stream = b"".join(frames for frames, _ in draw(client_streams))
    seed = draw(st.binary(max_size=15))
    flags = draw(st.sampled_from([1, 1, 1, 3, 0]))
    return bytes((flags, len(seed))) + seed + draw(mutated(st.just(stream)))


method_inputs = mutated(any_method.map(lambda m: m.encode()))
table_inputs = mutated(field_tables.map(encode_table))
# Without the properties check_properties decodes (headers, reply-to, expiration), half the
# time: the ones it validates by walking the bytes.
_plain_properties = basic_properties.map(
    lambda p: attrs.evolve(p, headers=None, reply_to=None, expiration=None)
)
property_inputs = mutated(st.one_of(basic_properties, _plain_properties).map(lambda p: p.encode()))


def _longstr_entry(name: bytes, raw: bytes) -> bytes:
    return bytes((len(name),)) + name + b"S" + struct.pack(">I", len(raw)) + raw


@st.composite
def sasl_inputs(draw: st.DrawFn) -> bytes:
    """A mechanism byte and a PLAIN or AMQPLAIN response (perhaps invalid UTF-8)."""
    text = st.one_of(st.text(max_size=10).map(str.encode), st.binary(max_size=10))
    if draw(st.booleans()):
        parts = draw(st.lists(text, min_size=1, max_size=4))
        return b"\x00" + draw(mutated(st.just(b"\0".join(parts))))
    table = draw(field_tables)
    extra = encode_table(table)[4:]
    entries = _longstr_entry(b"LOGIN", draw(text)) + _longstr_entry(b"PASSWORD", draw(text))
    return b"\x01" + draw(mutated(st.just(extra + entries)))


# -- the log --------------------------------------------------------------------------------------

_shortstr_text = st.text(max_size=8).filter(lambda s: len(s.encode()) <= 255)
record_lists = st.lists(
    st.tuples(
        st.integers(1, 3),  # the offset gap (compacted segments have gaps)
        st.integers(0, 2**40),  # timestamp
        _shortstr_text,
        _shortstr_text,
        st.binary(max_size=12),
        st.binary(max_size=200),
    ),
    max_size=12,
)


def segment_files(
    base: int, interval: int, records: list[tuple[int, int, str, str, bytes, bytes]]
) -> tuple[bytes, bytes, bytes]:
    """The record file and index files a segment with these records writes."""
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        segment = Segment(StorageEnv.default().files, Directory(directory), base, interval)
        offset = base - 1
        batch: list[tuple[int, int, Message]] = []  # runs of consecutive offsets, up to 3

        def write_batch() -> None:
            first = offset - len(batch) + 1
            stamp = max(entry[0] for entry in batch)
            segment.append(first, stamp, encode_batch(first, batch), offset)
            batch.clear()

        for gap, stamp, exchange, key, props, body in records:
            if batch and gap != 1:
                write_batch()
            offset += gap
            message = Message(exchange, key, props, body)
            if gap == 1 and len(records) % 2:  # half the inputs hold record batches
                batch.append((stamp, 1, message))
                if len(batch) == 3:
                    write_batch()
            else:
                segment.append(offset, stamp, encode_record(offset, stamp, 1, message))
        if batch:
            write_batch()
        segment.write_out()
        suffixes = (".log", ".index", ".timeindex")
        files = tuple((directory / segment_name(base, s)).read_bytes() for s in suffixes)
        segment.close()
    return files  # type: ignore[return-value]


@st.composite
def log_inputs(draw: st.DrawFn) -> bytes:
    """The ``log`` target's input: mode, index interval, base, index files, records (each file
    perhaps damaged)."""
    mode, interval_choice, base_choice = draw(st.tuples(*[st.integers(0, 255)] * 3))
    base = base_choice * 1000
    interval = (interval_choice % 8 + 1) * 64
    log_raw, index_raw, time_raw = segment_files(base, interval, draw(record_lists))
    index_raw = draw(st.one_of(st.just(index_raw), mutated(st.just(index_raw))))
    time_raw = draw(st.one_of(st.just(time_raw), mutated(st.just(time_raw))))
    log_raw = draw(mutated(st.just(log_raw)))
    return bytes((mode, interval_choice, base_choice)) + _framed(index_raw, time_raw, log_raw)


# -- the HTTP API ---------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
deep_json = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)
header_json = st.one_of(
    st.just(""),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(json.dumps),
    deep_json.map(lambda d: '{"h": ' + d + "}"),
    json_values.map(json.dumps),
)


@st.composite
def write_batches(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(0, 5))
    items = st.lists(st.binary(max_size=40), min_size=count, max_size=count)
    key = st.one_of(st.text(max_size=10).map(str.encode), st.integers(254, 257).map(b"k".__mul__))
    keys = st.lists(key, min_size=count, max_size=count)
    headers = st.lists(header_json.map(str.encode), min_size=count, max_size=count)
    batch = WriteBatch(
        array("i", draw(st.lists(st.integers(-2, 5), min_size=count, max_size=count))),
        BinaryColumn.of(draw(st.one_of(keys, items))),
        BinaryColumn.of(draw(items)),
        BinaryColumn.of(draw(headers)),
    )
    return encode_write(batch)


@st.composite
def read_batches(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(0, 5))
    items = st.lists(st.binary(max_size=40), min_size=count, max_size=count)
    numbers = st.lists(st.integers(-(2**63), 2**63 - 1), min_size=count, max_size=count)
    with_headers = draw(st.booleans())
    batch = ReadBatch(
        draw(st.integers(-(2**63), 2**63 - 1)),
        array("q", draw(numbers)),
        array("q", draw(numbers)),
        BinaryColumn.of(draw(items)),
        BinaryColumn.of(draw(items)),
        BinaryColumn.of(draw(items)) if with_headers else None,
    )
    return (b"\x02" if with_headers else b"\x01") + encode_read(batch)


recordbatch_inputs = mutated(st.one_of(write_batches().map(lambda b: b"\x00" + b), read_batches()))
bulk_record_inputs = mutated(write_batches())

_tables = st.one_of(st.dictionaries(st.text(max_size=8), json_values, max_size=4), json_values)
_record_optional = {
    "encoding": st.sampled_from(["utf-8", "base64", "latin-1", 1]),
    "key": st.one_of(st.text(max_size=20), st.integers(254, 257).map("k".__mul__), json_values),
    "partition": st.one_of(st.integers(-5, 2**65), st.text(max_size=5), json_values),
    "headers": _tables,
}
_records = st.one_of(
    st.fixed_dictionaries({"value": st.text(max_size=20)}, optional=_record_optional),
    st.fixed_dictionaries({}, optional={"value": json_values, **_record_optional}),
)
_numbers = st.one_of(st.integers(-5, 2**65), st.text(max_size=5), json_values)
# The bodies of each route: declare, produce.
_BODIES = (
    st.fixed_dictionaries({}, optional={"partitions": _numbers, "arguments": _tables}),
    st.one_of(
        _records,
        st.fixed_dictionaries({"records": st.one_of(st.lists(_records, max_size=3), json_values)}),
    ),
)
_queries = st.dictionaries(
    st.sampled_from(["partition", "limit", "max_bytes", "offset", "timestamp", "other"]),
    st.one_of(st.text(max_size=30), st.integers().map(str), st.datetimes().map(str)),
    max_size=4,
)


@st.composite
def http_json_inputs(draw: st.DrawFn) -> bytes:
    """A route, a query string and a JSON body (sometimes damaged or nested very deep)."""
    from urllib.parse import urlencode

    route = draw(st.integers(0, 2))
    query = urlencode(draw(_queries)).encode()
    body = draw(
        st.one_of(
            (_BODIES[route] if route < 2 else json_values).map(lambda v: json.dumps(v).encode()),
            json_values.map(lambda v: json.dumps(v).encode()),
            deep_json.map(lambda d: ('{"value": "v", "headers": {"a": ' + d + "}}").encode()),
            deep_json.map(str.encode),
        )
    )
    return bytes((route,)) + _framed(query, draw(mutated(st.just(body))))


# Inputs of each target; each target also gets arbitrary bytes.
INPUTS: dict[str, st.SearchStrategy[bytes]] = {
    "frames": frame_inputs(),
    "methods": method_inputs,
    "tables": table_inputs,
    "properties": property_inputs,
    "sasl": sasl_inputs(),
    "log": log_inputs(),
    "recordbatch": recordbatch_inputs,
    "bulk-records": bulk_record_inputs,
    "http-json": http_json_inputs(),
}
