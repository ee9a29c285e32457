"""Fuzz targets of the HTTP topic API's inputs: the bulk record formats (``recordbatch``), the
records of a bulk produce (``record_routes``), and the JSON bodies and query parameters of the
topic routes (``server/http/inputs.py``).

Documented errors: ``ValueError`` from ``recordbatch.decode_*``; ``RequestError`` with a 4xx
status from the HTTP layer. What the HTTP layer accepts must be storable: its header tables
encode as AMQP properties that the broker's own decoder reads back.
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any

from starlette.datastructures import QueryParams
from starlette.requests import Request

from tqbroker.broker.streams.topics import ProducerRecord
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.errors import DecodeError
from tqbroker.protocol.methods import BasicProperties
from tqbroker.recordbatch import decode_read, decode_write, encode_read, encode_write
from tqbroker.server.http import inputs
from tqbroker.server.http.errors import RequestError
from tqbroker.server.http.record_routes import record_at

from .common import Reader, target

MAX_MESSAGE_SIZE = 1024


@target("recordbatch", max_len=16384)
def fuzz_recordbatch(data: bytes) -> None:
    """TQR1 and TQW1 bodies: ``ValueError`` only; what decodes encodes back to the same bytes."""
    kind, body = (data[0], data[1:]) if data else (0, b"")
    try:
        if kind % 3 == 0:
            batch = decode_write(body)
        else:
            read = decode_read(body, headers=kind % 3 == 2)
    except ValueError:
        return
    if kind % 3 == 0:
        assert encode_write(batch) == body
    else:
        assert body.startswith(encode_read(read))


@target("bulk-records", max_len=16384)
def fuzz_bulk_records(data: bytes) -> None:
    """A ``POST /topics/{t}/records`` body (``WriteBatch``) checked as the route checks it:
    a 4xx ``RequestError`` only; every record it accepts is storable."""
    try:
        batch = decode_write(data)
    except ValueError:
        return
    try:
        records = [record_at(batch, i, MAX_MESSAGE_SIZE) for i in range(len(batch))]
    except RequestError as exc:
        _client_error(exc)
        return
    for record in records:
        _storable(record)


def _client_error(exc: RequestError) -> None:
    if not 400 <= exc.status < 500:
        raise AssertionError(f"a {exc.status} RequestError: {exc.message}")


def _storable(record: ProducerRecord) -> None:
    assert len(record.value) <= MAX_MESSAGE_SIZE
    assert len(record.key.encode()) <= 255
    _table_storable(record.headers)


def _table_storable(table: FieldTable) -> None:
    """The table encodes as message headers and decodes back (``topics._message`` encodes
    them; every reader decodes them)."""
    raw = BasicProperties(headers=dict(table), delivery_mode=2).encode()
    try:
        decoded = BasicProperties.decode(memoryview(raw))
    except DecodeError as exc:
        raise AssertionError(f"accepted headers the broker cannot decode: {exc}") from None
    assert decoded.encode() == raw


def _request(body: bytes, query: bytes = b"") -> Request:
    """A Starlette request with this body, as the ASGI server hands it to a route."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/topics/t/messages",
        "query_string": query,
        "headers": [(b"content-length", str(len(body)).encode())],
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits for anything (a request whose body is all there)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the coroutine waited")


def _declare(body: dict[str, Any]) -> None:
    """What ``topic_routes.declare_topic`` reads from its body."""
    inputs.integer(body.get("partitions", 1), "partitions")
    _table_storable(inputs.field_table(body.get("arguments", {}), "arguments"))


def _produce(body: dict[str, Any]) -> None:
    """What ``topic_routes.produce`` reads from its body."""
    single = "records" not in body
    raw = [body] if single else body["records"]
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "'records' must be a non-empty list of records")
    for item in raw:
        _storable(inputs.producer_record(item, MAX_MESSAGE_SIZE))


def _consume(query: QueryParams) -> None:
    """What ``topic_routes.consume`` and ``record_routes.read_records`` read from the query."""
    inputs.integer(query.get("partition", "0"), "partition")
    inputs.integer(query.get("limit", "100"), "limit")
    inputs.max_bytes(query)
    inputs.start_offset(query.get("offset"))
    if "timestamp" in query:
        inputs.timestamp(query["timestamp"])


@target("http-json", max_len=8192)
def fuzz_http_json(data: bytes) -> None:
    """The JSON bodies and query parameters of the topic routes: a 4xx ``RequestError``
    only; what is accepted is storable."""
    reader = Reader(data)
    route = reader.byte() % 3
    query, body = reader.parts(2)
    try:
        if route == 2:
            _consume(QueryParams(query.decode("latin-1")))
            return
        parsed = _run(inputs.json_object(_request(body)))
        assert isinstance(parsed, dict)
        if route == 0:
            _declare(parsed)
        else:
            _produce(parsed)
    except RequestError as exc:
        _client_error(exc)


def json_body(value: object) -> bytes:
    """A JSON value as a request body (for the seeds and the Hypothesis tests)."""
    return json.dumps(value).encode()
