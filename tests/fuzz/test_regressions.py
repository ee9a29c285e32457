"""The bugs the fuzzers found, each pinned: the input the fuzzer made, at the unit it broke, and
through a real client over loopback where a client can send it.
"""

from __future__ import annotations

import json
import socket
import struct
from array import array
from pathlib import Path

import httpx
import pytest

from tests.support.rawamqp import RawAMQP
from tqbroker.auth.sasl import parse_response
from tqbroker.backends.log import segment_reads
from tqbroker.backends.log.format import encode_record
from tqbroker.backends.log.recovery import scan_segment
from tqbroker.backends.log.segment import Segment, segment_name
from tqbroker.model import Message
from tqbroker.protocol.codec import MAX_TABLE_DEPTH, FieldTable
from tqbroker.protocol.frames import PROTOCOL_HEADER
from tqbroker.protocol.methods import BasicProperties, ConnectionStart, ConnectionStartOk
from tqbroker.recordbatch import BinaryColumn, WriteBatch, encode_write
from tqbroker.server.http import inputs
from tqbroker.server.http.errors import RequestError
from tqbroker.storage_env import StorageEnv
from tqbroker.storage_env.filecache import Directory
from tqbroker.testing import RunningBroker

from .http_targets import _request, _run


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
        capabilities: FieldTable = {"capabilities": {"authentication_failure_close": True}}
        conn.send_method(0, ConnectionStartOk(capabilities, "AMQPLAIN", response, "en_US"))
        close = conn.expect_connection_close(403)
        assert "UTF-8" in close.reply_text


# -- the topic API's JSON inputs ----------------------------------------------------------------


def _nested(depth: int) -> object:
    """``depth`` lists one inside the other."""
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [31, 32, 40, 3000])
def test_header_tables_nested_as_deep_as_the_codec_reads(depth: int) -> None:
    """Headers nested deeper than the AMQP decoder reads (``MAX_TABLE_DEPTH``) are a 400, not
    a record stored that no reader can decode (nor, nested deeper still, a RecursionError)."""
    headers = {"h": _nested(depth)}
    if depth < MAX_TABLE_DEPTH:
        table = inputs.field_table(headers, "headers")
        raw = BasicProperties(headers=table).encode()
        assert BasicProperties.decode(memoryview(raw)).headers == headers
        return
    with pytest.raises(RequestError, match="nested") as refused:
        inputs.field_table(headers, "headers")
    assert refused.value.status == 400


def test_deeply_nested_json_body_is_a_400() -> None:
    request = _request(b"[" * 100_000)
    with pytest.raises(RequestError) as refused:
        _run(inputs.json_object(request))
    assert refused.value.status == 400


def test_base64_value_that_is_not_ascii_is_a_400() -> None:
    with pytest.raises(RequestError, match="base64") as refused:
        inputs.producer_record({"value": "\u00e9", "encoding": "base64"}, 1024)
    assert refused.value.status == 400


@pytest.mark.parametrize(
    "body",
    [
        b'{"value": "v", "headers": {"h": ' + json.dumps(_nested(40)).encode() + b"}}",
        b'{"value": "v", "headers": {"h": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
        b"[" * 100_000,
        json.dumps({"value": "\u00e9t\u00e9", "encoding": "base64"}).encode(),
    ],
    ids=["headers-40-deep", "headers-5000-deep", "body-100000-deep", "base64-not-ascii"],
)
def test_produce_refuses_with_400(http: httpx.Client, body: bytes) -> None:
    """Over HTTP: each of these bodies was answered 500 (or 201, and then every read of the
    partition 500)."""
    assert http.put("/topics/fuzzed", json={"partitions": 1}).status_code in (200, 201)
    response = http.post("/topics/fuzzed/messages", content=body)
    assert response.status_code == 400, response.text
    assert http.get("/topics/fuzzed/messages", params={"offset": "earliest"}).status_code == 200


def test_bulk_write_deep_headers_is_a_400(http: httpx.Client) -> None:
    assert http.put("/topics/fuzzed-bulk", json={"partitions": 1}).status_code in (200, 201)
    deep = b'{"h": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    body = encode_write(
        WriteBatch(
            array("i", [0]),
            BinaryColumn.of([b"k"]),
            BinaryColumn.of([b"v"]),
            BinaryColumn.of([deep]),
        )
    )
    response = http.post(
        "/topics/fuzzed-bulk/records",
        content=body,
        headers={"content-type": "application/x-tqbroker-records"},
    )
    assert response.status_code == 400, response.text


# -- log segment recovery -----------------------------------------------------------------------


def test_append_after_untruncated_scan_reads_back(tmp_path: Path) -> None:
    """The fuzzer's case: the active segment of a clean shutdown whose last record is damaged
    (``Log.open`` loads it, ``load_segment`` finds its tail inconsistent and rescans it
    without truncating); a reader fills the read-ahead cache; a publish appends."""
    records = b"".join(
        encode_record(i, 1000 + i, 1, Message("", "q", b"\x00\x00", b"m%d" % i)) for i in range(2)
    )
    damaged = b"\x00\x00\x00\x1a" + b"\x00" * 26  # an impossible length: 26
    (tmp_path / segment_name(0, ".log")).write_bytes(records + damaged)
    segment = Segment(StorageEnv.default().files, Directory(tmp_path), 0, 4096)
    try:
        assert not scan_segment(segment, truncate=False)
        assert segment.next_offset == 2
        assert [r.message.body for r in segment_reads.records(segment, 0)] == [
            b"m0",
            b"m1",
        ]  # cache filled
        message = Message("", "q", b"\x00\x00", b"after")
        segment.append(2, 2000, encode_record(2, 2000, 1, message))
        segment.write_out()
        found = segment_reads.read(segment, 2)
        assert found is not None
        assert found.message.body == b"after"
    finally:
        segment.close()


def test_basic_credentials_not_ascii_are_a_401(tqbroker_thread: RunningBroker) -> None:
    """Found reading the code next to the base64 bug of the produce route (the same mistake);
    a raw request, since HTTP clients refuse to send such a header."""
    assert tqbroker_thread.http_port is not None
    with socket.create_connection((tqbroker_thread.host, tqbroker_thread.http_port)) as sock:
        sock.sendall(
            b"GET /topics/x/offsets HTTP/1.1\r\nHost: localhost\r\n"
            b"Authorization: Basic \xe9\xe9\r\nConnection: close\r\n\r\n"
        )
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert response.startswith(b"HTTP/1.1 401"), response[:200]
