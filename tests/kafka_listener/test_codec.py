"""The Kafka message codec (``tqbroker.protocol.kafka``) against an independent one:
kafka-python 3's, built at run time from its own copy of Kafka's JSON schemas (a later Kafka
than ours: the versions both know are compared). Hypothesis draws a message of a version;
what we encode, kafka-python decodes to the same values and encodes to the same bytes, and we
decode our bytes back to what we drew.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol import admin, consumer, metadata, producer, sasl

from tqbroker.protocol.kafka.messages import Field, Schema, _within, decode, encode
from tqbroker.protocol.kafka.requests import (
    RequestHeader,
    UnknownApi,
    decode_request,
    encode_response,
)
from tqbroker.protocol.kafka.schemas import REQUESTS, RESPONSES
from tqbroker.protocol.kafka.wire import Malformed, Reader, Writer

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(os.environ.get("TQBROKER_KAFKA_SCHEMAS", ROOT.parent / "shared" / "kafka-schemas"))


def kafka_python_class(schema: Schema) -> Any:
    """kafka-python's class for the message ``schema`` describes."""
    for module in (admin, consumer, metadata, producer, sasl):
        found = getattr(module, schema.name, None)
        if found is not None:
            return found
    raise LookupError(schema.name)


def common_versions(schema: Schema) -> list[int]:
    theirs = kafka_python_class(schema)
    low, high = schema.valid
    return [v for v in range(low, high + 1) if theirs.min_version <= v <= theirs.max_version]


CASES = [
    (schema, version)
    for table in (REQUESTS, RESPONSES)
    for schema in table.values()
    for version in common_versions(schema)
]

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}


def values(fields: tuple[Field, ...], version: int, depth: int = 0) -> st.SearchStrategy[Any]:
    """A struct of ``fields`` as it exists in ``version`` (only the fields it has)."""
    present = {f.name: field_value(f, version, depth) for f in fields if present_in(f, version)}
    return st.fixed_dictionaries(present)


def present_in(field: Field, version: int) -> bool:
    return _within(field.versions, version)


def field_value(field: Field, version: int, depth: int) -> st.SearchStrategy[Any]:
    one = one_value(field, version, depth)
    if field.array:
        many = st.lists(one, max_size=3 if depth < 2 else 1)
        return st.one_of(st.none(), many) if _within(field.nullable, version) else many
    if _within(field.nullable, version):
        return st.one_of(st.none(), one)
    return one


def one_value(field: Field, version: int, depth: int) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == "struct":
        return values(field.fields, version, depth + 1)
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        return st.integers(low, high)
    if kind == "string":
        return st.text(max_size=8)
    if kind in ("bytes", "records"):
        return st.binary(max_size=12)
    if kind == "bool":
        return st.booleans()
    if kind == "float64":
        return st.floats(allow_nan=False)
    if kind == "uuid":
        return st.uuids().map(lambda u: uuid.UUID(int=u.int))
    raise AssertionError(kind)


@st.composite
def messages(draw: st.DrawFn) -> tuple[Schema, int, dict[str, Any]]:
    schema, version = draw(st.sampled_from(CASES))
    drawn = draw(values(schema.fields, version))
    if schema.name == "ApiVersionsResponse":
        drawn["error_code"] = 0  # kafka-python reads an error reply as version 0, as it must
    return schema, version, drawn


def as_drawn(theirs: Any, drawn: Any) -> Any:
    """kafka-python's decoded object in the shape of ``drawn`` (the fields of that version):
    its attributes, bytes as bytes. A field it renames (``*_authorized_operations`` become a
    set of bits in ``authorized_operations``) is left to the comparison of the bytes."""
    if isinstance(drawn, dict):
        return {
            key: as_drawn(getattr(theirs, key), drawn[key])
            if not key.endswith("authorized_operations")
            else drawn[key]
            for key in drawn
        }
    if isinstance(drawn, list):
        return [as_drawn(t, d) for t, d in zip(theirs, drawn, strict=True)]
    if isinstance(theirs, (bytearray, memoryview)):
        return bytes(theirs)
    return theirs


def restricted(value: Any, drawn: Any) -> Any:
    """Our decoded ``value`` restricted to the keys ``drawn`` has."""
    if isinstance(drawn, dict):
        return {key: restricted(value[key], drawn[key]) for key in drawn}
    if isinstance(drawn, list):
        return [restricted(v, d) for v, d in zip(value, drawn, strict=True)]
    return value


@settings(max_examples=600, deadline=None)
@given(messages())
def test_our_bytes_are_kafka_pythons(case: tuple[Schema, int, dict[str, Any]]) -> None:
    schema, version, drawn = case
    writer = Writer()
    encode(schema, version, drawn, writer)
    ours = writer.getvalue()
    theirs_class = kafka_python_class(schema)
    theirs = theirs_class.decode(ours, version=version)
    assert as_drawn(theirs, drawn) == drawn, schema.name
    if not hasattr(theirs, "_header"):  # kafka-python leaves it unset when decoding a body
        theirs._header = None
    assert bytes(theirs.encode()) == ours, (schema.name, version)
    reader = Reader(ours)
    assert restricted(decode(schema, version, reader), drawn) == drawn
    assert reader.remaining == 0


def test_every_served_message_is_compared() -> None:
    """Each request and response has versions both codecs know."""
    names = {schema.name for schema, _version in CASES}
    assert len(names) == 2 * len(REQUESTS)


def test_a_request_with_its_header() -> None:
    """A Metadata v9 request (flexible: header v2, compact strings, tagged fields) from
    kafka-python, with its header, as a client sends it."""
    request = metadata.MetadataRequest(
        version=9,
        topics=[metadata.MetadataRequest.MetadataRequestTopic(name="orders")],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    request.with_header(correlation_id=7, client_id="cli")
    frame = bytes(request.encode(header=True))
    header, body = decode_request(frame)
    assert header == RequestHeader(3, 9, 7, "cli")
    assert body["topics"] == [{"topic_id": uuid.UUID(int=0), "name": "orders"}]
    assert body["allow_auto_topic_creation"] is False
    assert body["include_topic_authorized_operations"] is True


def test_the_api_versions_error_reply_kafka_python_reads() -> None:
    """ApiVersions' response header is always v0 (even for a flexible v3 request); its error
    reply at an unsupported version (35) is the bytes ``shared/reference/kafka.md`` §2
    records kafka-python making."""
    header = RequestHeader(18, 0, 1, "c")
    body = {"error_code": 35, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]}
    assert encode_response(header, body).hex() == "0000001000000001002300000001001200000004"
    flexible = encode_response(header._replace(api_version=3), {**body, "error_code": 0})
    reply = metadata.ApiVersionsResponse.decode(flexible[8:], version=3)
    assert reply.api_keys[0].max_version == 4
    assert flexible[4:8] == b"\x00\x00\x00\x01"  # the correlation id, no tagged fields after


def test_unknown_apis_and_versions_are_refused() -> None:
    with pytest.raises(UnknownApi) as unknown:
        decode_request(b"\x03\xe7\x00\x00\x00\x00\x00\x05\x00\x00")  # API key 999
    assert unknown.value.header.correlation_id == 5
    with pytest.raises(UnknownApi) as too_new:
        decode_request(b"\x00\x03\x01\x00\x00\x00\x00\x06\x00\x00")  # Metadata v256
    assert too_new.value.header.api_version == 256


@settings(max_examples=300, deadline=None)
@given(messages(), st.data())
def test_a_cut_or_damaged_message_raises_value_error(
    case: tuple[Schema, int, dict[str, Any]], data: st.DataObject
) -> None:
    """Truncated or overwritten bytes decode or raise ``Malformed``: nothing else escapes."""
    schema, version, drawn = case
    writer = Writer()
    encode(schema, version, drawn, writer)
    raw = bytearray(writer.getvalue())
    if raw:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    raw += data.draw(st.binary(max_size=6))
    with contextlib.suppress(Malformed):
        decode(schema, version, Reader(bytes(raw)))


@pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"Kafka's JSON schemas are not at {SCHEMAS}")
def test_generated_schemas_module_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, "tools/gen_kafka.py", "--check", "--schemas", str(SCHEMAS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
