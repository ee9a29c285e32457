"""The HTTP API: topics (the Kafka view of streams) over JSON, served by hypercorn's Trio worker
inside the broker's nursery. The management API will extend this same app.

Responsibilities:
- the routes and their JSON (``GET /health``; ``PUT /topics/{topic}`` declares a partitioned
  stream; ``POST``/``GET /topics/{topic}/messages``; ``GET /topics/{topic}/offsets``;
  ``GET /topics/{topic}/groups/{group}``; the columnar bulk ``GET
  /topics/{topic}/partitions/{p}/records`` and ``POST /topics/{topic}/records``, in
  ``recordbatch.py``'s formats, for the Spark data source), each a thin translation to
  ``broker.topics``;
- HTTP Basic authentication against the broker's users (``loopback_only`` users from loopback
  only), and the user's vhost permissions; ``/health`` is open;
- values travel as text (``"encoding": "utf-8"``, the default) or base64
  (``"encoding": "base64"``); timestamps are milliseconds since the epoch or ISO-8601; header
  values that JSON cannot carry as they are come as ``{"bytes": <base64>}`` (byte strings) or
  strings (non-finite floats, undecodable text);
- size limits: a request body of at most ``MAX_REQUEST_BYTES``, a value of at most the broker's
  ``max_message_size`` (413), a read of at most ``max_bytes`` of values (1 MiB by default, as
  Kafka's ``max.partition.fetch.bytes``);
- every error is JSON, ``{"error": <reason>, "message": <what to fix>}`` with a 4xx (or 503)
  status; unknown paths and methods too, and a 500 for a bug;
- ``serve_http``: bind and serve until cancelled, reporting the bound addresses through the
  Trio start protocol.

Every route takes an optional ``vhost`` query parameter (default ``/``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import hypercorn.config
import hypercorn.trio
import trio
from hypercorn.typing import Framework
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import clock
from ..auth import is_loopback
from ..broker import topics
from ..broker.broker import Broker
from ..broker.topics import ConsumerRecord, ProducerRecord, TopicError
from ..broker.vhost import VirtualHost
from ..protocol.codec import FieldTable, FieldValue
from ..recordbatch import decode_write, encode_read, json_value

log = logging.getLogger("tqbroker.http")

Address = tuple[str, int]
MAX_REQUEST_BYTES = 64 * 1024 * 1024
RECORDS_MEDIA_TYPE = "application/x-tqbroker-records"
DEFAULT_READ_BYTES = 1024 * 1024
_REASONS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    500: "internal_error",
    503: "unavailable",
}


def error(status: int, message: str) -> JSONResponse:
    headers = {"www-authenticate": 'Basic realm="tqbroker"'} if status == 401 else None
    return JSONResponse(
        {"error": _REASONS.get(status, "error"), "message": message},
        status_code=status,
        headers=headers,
    )


def create_app(broker: Broker) -> Starlette:
    """The ASGI app serving ``broker``."""

    async def vhost_of(request: Request) -> VirtualHost:
        """The request's vhost, once its credentials and permissions are checked."""
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        try:
            username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            username = password = ""
        if scheme.lower() != "basic" or not username:
            raise TopicError(401, "HTTP Basic credentials of a broker user are required")
        user = await trio.to_thread.run_sync(broker.users.verify, username, password)
        if user is None:
            raise TopicError(401, "login refused")
        if user.loopback_only and not is_loopback(request.client.host if request.client else ""):
            raise TopicError(401, f"user '{username}' can only connect via localhost")
        name = request.query_params.get("vhost", "/")
        if not user.may_open(name):
            raise TopicError(403, f"user '{username}' has no access to vhost '{name}'")
        vhost = broker.vhosts.get(name)
        if vhost is None:
            raise TopicError(404, f"no vhost '{name}'")
        return vhost

    async def health(request: Request) -> Response:
        unhealthy = sorted(
            f.backend.name for f in broker.flushers.values() if not f.backend.healthy
        )
        if unhealthy:
            return JSONResponse(
                {"status": "degraded", "failing_backends": unhealthy}, status_code=503
            )
        return JSONResponse({"status": "ok"})

    async def declare_topic(request: Request) -> Response:
        body = await _json_object(request)
        count = _integer(body.get("partitions", 1), "partitions")
        arguments = _field_table(body.get("arguments", {}), "arguments")
        topic = request.path_params["topic"]
        created = topics.declare(await vhost_of(request), topic, count, arguments)
        return JSONResponse(
            {"topic": topic, "partitions": count, "created": created},
            status_code=201 if created else 200,
        )

    async def produce(request: Request) -> Response:
        vhost = await vhost_of(request)
        body = await _json_object(request)
        single = "records" not in body
        raw = [body] if single else body["records"]
        if not isinstance(raw, list) or not raw:
            raise TopicError(400, "'records' must be a non-empty list of records")
        records = [_producer_record(r, broker.config.max_message_size) for r in raw]
        landed = await topics.produce(vhost, request.path_params["topic"], records)
        assert landed is not None  # no producer id: never a duplicate
        results = [{"partition": p, "offset": o} for p, o in landed]
        return JSONResponse(results[0] if single else {"offsets": results}, status_code=201)

    async def consume(request: Request) -> Response:
        query = request.query_params
        partition = _integer(query.get("partition", "0"), "partition")
        limit = _integer(query.get("limit", "100"), "limit")
        max_bytes = _integer(query.get("max_bytes", str(DEFAULT_READ_BYTES)), "max_bytes")
        offset = _start_offset(query.get("offset"))
        timestamp = _timestamp(query["timestamp"]) if "timestamp" in query else None
        if offset is not None and timestamp is not None:
            raise TopicError(400, "give 'offset' or 'timestamp', not both")
        vhost = await vhost_of(request)
        topic = request.path_params["topic"]
        if offset == "latest":
            offset = topics.partition(vhost, topic, partition).stream.next_offset
        records = topics.read(
            vhost,
            topic,
            partition,
            offset=offset if isinstance(offset, int) else None,
            timestamp_ms=timestamp,
            limit=limit,
            max_bytes=max_bytes,
        )
        next_offset = (
            records[-1].offset + 1
            if records
            else topics.partition(vhost, topic, partition).stream.next_offset
        )
        return JSONResponse(
            {
                "topic": topic,
                "partition": partition,
                "messages": [_record_json(r) for r in records],
                "next_offset": next_offset,
            }
        )

    async def read_records(request: Request) -> Response:
        """The columnar bulk read (``recordbatch.ReadBatch``)."""
        query = request.query_params
        vhost = await vhost_of(request)
        batch = topics.read_batch(
            vhost,
            request.path_params["topic"],
            _integer(request.path_params["partition"], "partition"),
            offset=_integer(query.get("offset", "0"), "offset"),
            end=_integer(query["end"], "end") if "end" in query else None,
            max_bytes=_integer(query.get("max_bytes", str(DEFAULT_READ_BYTES)), "max_bytes"),
            headers=query.get("headers", "false") == "true",
        )
        return Response(encode_read(batch), media_type=RECORDS_MEDIA_TYPE)

    async def write_records(request: Request) -> Response:
        """The columnar bulk write (``recordbatch.WriteBatch``), idempotent with a producer
        id and the sequence of its first record."""
        vhost = await vhost_of(request)
        producer = None
        if "x-producer-id" in request.headers:
            sequence = _integer(request.headers.get("x-producer-sequence"), "x-producer-sequence")
            producer = (request.headers["x-producer-id"], sequence)
        try:
            batch = decode_write(await _body(request))
        except ValueError as exc:
            raise TopicError(400, f"not a valid TQW1 body: {exc}") from None
        limit = broker.config.max_message_size
        records = []
        for i in range(len(batch)):
            value = batch.values[i]
            if len(value) > limit:
                raise TopicError(413, f"a value is limited to {limit} bytes (got {len(value)})")
            raw_headers = batch.headers[i]
            try:
                key = batch.keys[i].decode()
                headers = (
                    json.loads(raw_headers, parse_constant=_no_constants) if raw_headers else {}
                )
            except ValueError as exc:
                raise TopicError(400, f"record {i}: {exc}") from None
            if len(batch.keys[i]) > 255:
                raise TopicError(400, f"record {i}: a key is limited to 255 bytes")
            partition = batch.partitions[i]
            records.append(
                ProducerRecord(
                    value,
                    key,
                    _field_table(headers, "headers"),
                    partition if partition >= 0 else None,
                )
            )
        landed = await topics.produce(
            vhost, request.path_params["topic"], records, producer=producer
        )
        if landed is None:
            return JSONResponse({"duplicate": True, "count": 0, "skipped": len(records)})
        skipped = len(records) - len(landed)
        return JSONResponse({"count": len(landed), "skipped": skipped}, status_code=201)

    async def offsets(request: Request) -> Response:
        vhost = await vhost_of(request)
        topic = request.path_params["topic"]
        found: list[dict[str, int | str | None]] = [
            {
                "partition": o.partition,
                "queue": o.queue,
                "earliest": o.earliest,
                "latest": o.latest,
            }
            for o in topics.offsets(vhost, topic)
        ]
        if "timestamp" in request.query_params:
            timestamp = _timestamp(request.query_params["timestamp"])
            for entry, offset in zip(
                found, topics.offsets_for_timestamp(vhost, topic, timestamp), strict=True
            ):
                entry["timestamp"] = offset
        return JSONResponse({"topic": topic, "partitions": found})

    async def group(request: Request) -> Response:
        topic = request.path_params["topic"]
        name = request.path_params["group"]
        found = topics.group(await vhost_of(request), topic, name)
        return JSONResponse(
            {
                "topic": topic,
                "group": name,
                "partitions": [
                    {
                        "partition": p.partition,
                        "committed": p.committed,
                        "latest": p.latest,
                        "lag": p.lag,
                        "reader": p.reader,
                    }
                    for p in found
                ],
                "lag": sum(p.lag or 0 for p in found),
            }
        )

    async def topic_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TopicError)
        return error(exc.status, exc.message)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("HTTP %s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, f"{request.method} {request.url.path}: internal error (in the log)")

    handlers: Mapping[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        TopicError: topic_error,
        HTTPException: http_error,
        Exception: internal_error,
    }
    return Starlette(
        routes=[
            Route("/health", health),
            Route("/topics/{topic}", declare_topic, methods=["PUT"]),
            Route("/topics/{topic}/messages", produce, methods=["POST"]),
            Route("/topics/{topic}/messages", consume, methods=["GET"]),
            Route("/topics/{topic}/offsets", offsets),
            Route("/topics/{topic}/records", write_records, methods=["POST"]),
            Route("/topics/{topic}/partitions/{partition}/records", read_records),
            Route("/topics/{topic}/groups/{group}", group),
        ],
        exception_handlers=handlers,
    )


async def serve_http(
    broker: Broker,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[Address]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API on ``host:port`` until cancelled; ``nursery.start`` returns the bound
    addresses."""
    config = hypercorn.config.Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.include_server_header = False

    async def started(*, task_status: trio.TaskStatus[list[str]]) -> None:
        app = cast(Framework, create_app(broker))  # an ASGI app hypercorn's types don't know
        await hypercorn.trio.serve(app, config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(started)
        task_status.started([_address(bind) for bind in binds])


def _address(bind: str) -> Address:
    """``("127.0.0.1", 15672)`` from hypercorn's ``http://127.0.0.1:15672``."""
    host, _, port = bind.removeprefix("http://").rpartition(":")
    return host.strip("[]"), int(port)


# -- JSON in -----------------------------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def _body(request: Request) -> bytes:
    """The request body, at most ``MAX_REQUEST_BYTES`` (413)."""
    declared = request.headers.get("content-length", "0")
    if declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
        raise TopicError(413, f"request bodies are limited to {MAX_REQUEST_BYTES} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_REQUEST_BYTES:
            raise TopicError(413, f"request bodies are limited to {MAX_REQUEST_BYTES} bytes")
    return bytes(raw)


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await _body(request)
    if not raw:
        return {}
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except ValueError as exc:
        raise TopicError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise TopicError(400, "the request body must be a JSON object")
    return body


def _integer(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise TopicError(400, f"'{name}' must be an integer (got {value!r})")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise TopicError(400, f"'{name}' must be an integer (got {value!r})")


def _start_offset(value: str | None) -> int | str | None:
    if value is None or value in ("earliest", "latest"):
        return value
    offset = _integer(value, "offset")
    if offset < 0:
        raise TopicError(400, f"'offset' must be >= 0, 'earliest' or 'latest' (got {value})")
    return offset


def _timestamp(value: str) -> int:
    """Milliseconds since the epoch, from an integer or an ISO-8601 time (UTC if it says no
    zone)."""
    try:
        return int(value)
    except ValueError:
        pass
    moment = clock.parse_iso_time(value)
    if moment is None:
        raise TopicError(
            400,
            f"'timestamp' must be milliseconds since the epoch or an ISO-8601 time (got {value!r})",
        )
    return int(moment.timestamp() * 1000)


def _producer_record(raw: object, max_size: int) -> ProducerRecord:
    if not isinstance(raw, dict):
        raise TopicError(400, "a record must be a JSON object with a 'value'")
    value = raw.get("value")
    if not isinstance(value, str):
        raise TopicError(
            400, 'a record needs a \'value\' string (text, or base64 with "encoding": "base64")'
        )
    encoding = raw.get("encoding", "utf-8")
    if encoding == "utf-8":
        body = _utf8(value, "value")
    elif encoding == "base64":
        try:
            body = base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise TopicError(400, f"'value' is not valid base64: {exc}") from None
    else:
        raise TopicError(400, f"'encoding' must be 'utf-8' or 'base64' (got {encoding!r})")
    if len(body) > max_size:
        raise TopicError(413, f"a value is limited to {max_size} bytes (got {len(body)})")
    key = raw.get("key", "")
    if not isinstance(key, str) or len(_utf8(key, "key")) > 255:
        raise TopicError(400, "'key' must be a string of at most 255 bytes (a routing key)")
    partition = raw.get("partition")
    if partition is not None:
        partition = _integer(partition, "partition")
    headers = _field_table(raw.get("headers", {}), "headers")
    return ProducerRecord(body, key, headers, partition)


def _utf8(text: str, name: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise TopicError(400, f"'{name}' is not valid Unicode text") from None


def _field_table(value: object, name: str) -> FieldTable:
    if not isinstance(value, dict):
        raise TopicError(400, f"'{name}' must be a JSON object")
    for key in value:
        if len(_utf8(key, name)) > 255:
            raise TopicError(400, f"'{name}': a name is limited to 255 bytes ({key[:20]!r}...)")
    return {k: _field_value(v, name) for k, v in value.items()}


def _field_value(value: object, name: str) -> FieldValue:
    if isinstance(value, str):
        _utf8(value, name)
        return value
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise TopicError(400, f"'{name}': {value} does not fit in 64 bits")
        return value
    if isinstance(value, list):
        return [_field_value(v, name) for v in value]
    if isinstance(value, dict):
        return _field_table(value, name)
    raise TopicError(400, f"'{name}': unsupported value {value!r}")


# -- JSON out ----------------------------------------------------------------------------------


def _record_json(record: ConsumerRecord) -> dict[str, Any]:
    try:
        value, encoding = record.value.decode(), "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(record.value).decode(), "base64"
    return {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
        "key": record.key,
        "headers": json_value(record.headers),
        "value": value,
        "encoding": encoding,
    }
