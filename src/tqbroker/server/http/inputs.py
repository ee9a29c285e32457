"""What a request carries, read and checked: its body (at most ``MAX_REQUEST_BYTES``, 413; 408
if it does not arrive in time), JSON (at most ``MAX_JSON_VALUES`` values, 413, and
``MAX_JSON_DEPTH`` levels deep, 400), integer parameters (64-bit), offsets, timestamps and the
records of a JSON produce.

Values travel as text (``"encoding": "utf-8"``, the default) or base64 (``"encoding":
"base64"``); timestamps are milliseconds since the epoch or ISO-8601; header values become
field-table values (64-bit integers, names of at most 255 bytes, nested as deep as the AMQP
decoder reads). Bad input is a ``RequestError`` (400, or 413 for sizes).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from typing import Any

from starlette.datastructures import QueryParams
from starlette.requests import ClientDisconnect, Request

from ... import clock
from ...broker.streams.service import ProducerRecord
from ...protocol.codec import MAX_TABLE_DEPTH, FieldTable, FieldValue
from ...protocol.methods import BasicProperties
from .errors import RequestError
from .jsonbody import parse_json_paced
from .limits import body_timed_out

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_READ_BYTES = 1024 * 1024  # as Kafka's max.partition.fetch.bytes
INT64 = (-(2**63), 2**63 - 1)
# A content header frame: frame head (7) and end (1), class, weight and body size (12).
CONTENT_HEADER_OVERHEAD = 7 + 1 + 12


async def read_body(request: Request) -> bytes:
    """The request body, at most ``MAX_REQUEST_BYTES`` (413)."""
    declared = request.headers.get("content-length", "0")
    if declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
        raise RequestError(413, f"request bodies are limited to {MAX_REQUEST_BYTES} bytes")
    raw = bytearray()
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_REQUEST_BYTES:
                raise RequestError(413, f"request bodies are limited to {MAX_REQUEST_BYTES} bytes")
    except ClientDisconnect:
        if body_timed_out(request.scope):
            raise RequestError(408, "the request body did not arrive in time") from None
        raise RequestError(400, "the client closed the request before its body") from None
    return bytes(raw)


async def json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object (an empty body is ``{}``)."""
    raw = await read_body(request)
    if not raw:
        return {}
    try:
        body = await parse_json_paced(raw)
    except ValueError as exc:
        raise RequestError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def integer(value: object, name: str, low: int = INT64[0], high: int = INT64[1]) -> int:
    """An integer parameter ``name`` between ``low`` and ``high`` (64-bit by default), from a
    JSON integer or a decimal string."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) <= 40:
        with contextlib.suppress(ValueError):
            number = int(value)
    shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else "a long text"
    if number is None:
        raise RequestError(400, f"'{name}' must be an integer (got {shown})")
    if not low <= number <= high:
        if (low, high) == INT64:
            raise RequestError(400, f"'{name}' is out of range: {number} does not fit in 64 bits")
        raise RequestError(400, f"'{name}' must be between {low} and {high} (got {number})")
    return number


def topic_configs(value: object) -> dict[str, str | None]:
    """Kafka topic configs (``{"retention.ms": "86400000", ...}``): each a string, a number
    (taken as its text) or null (the default); names and values are checked by the stream
    service (``topic_config``)."""
    if not isinstance(value, dict):
        raise RequestError(400, "'configs' must be a JSON object of Kafka topic configs")
    configs: dict[str, str | None] = {}
    for name, given in value.items():
        if given is None or isinstance(given, str):
            configs[name] = given
        elif isinstance(given, int | float) and not isinstance(given, bool):
            configs[name] = str(given)
        else:
            raise RequestError(400, f"config '{name}' must be a string, a number or null")
    return configs


def max_bytes(query: QueryParams) -> int:
    """A read's ``max_bytes`` of values (``DEFAULT_READ_BYTES`` unless the query says)."""
    return integer(query.get("max_bytes", str(DEFAULT_READ_BYTES)), "max_bytes")


def start_offset(value: str | None) -> int | str | None:
    """Where a read starts: an offset >= 0, ``earliest``, ``latest`` or None (not given)."""
    if value is None or value in ("earliest", "latest"):
        return value
    offset = integer(value, "offset", -(2**63), INT64[1])
    if offset < 0:
        raise RequestError(400, f"'offset' must be >= 0, 'earliest' or 'latest' (got {value})")
    return offset


def timestamp(value: str) -> int:
    """Milliseconds since the epoch, from an integer or an ISO-8601 time (UTC if it says no
    zone)."""
    if value.lstrip("-").isdigit():
        return integer(value, "timestamp")
    moment = clock.parse_iso_time(value[:64])
    if moment is None:
        raise RequestError(
            400,
            "'timestamp' must be milliseconds since the epoch or an ISO-8601 time "
            f"(got {value[:64]!r})",
        )
    return int(moment.timestamp() * 1000)


def producer_record(raw: object, max_size: int, frame_max: int = 0) -> ProducerRecord:
    """A record of a JSON produce (a value of at most ``max_size`` bytes; headers that fit in
    an AMQP frame of ``frame_max`` bytes, ``headers_fit``)."""
    if not isinstance(raw, dict):
        raise RequestError(400, "a record must be a JSON object with a 'value'")
    value = raw.get("value")
    if not isinstance(value, str):
        raise RequestError(
            400, 'a record needs a \'value\' string (text, or base64 with "encoding": "base64")'
        )
    encoding = raw.get("encoding", "utf-8")
    if encoding == "utf-8":
        body = _utf8(value, "value")
    elif encoding == "base64":
        try:
            body = base64.b64decode(value, validate=True)
        except ValueError as exc:  # binascii.Error, or text that is not ASCII
            raise RequestError(400, f"'value' is not valid base64: {exc}") from None
    else:
        raise RequestError(400, f"'encoding' must be 'utf-8' or 'base64' (got {encoding!r})")
    if len(body) > max_size:
        raise RequestError(413, f"a value is limited to {max_size} bytes (got {len(body)})")
    key = raw.get("key", "")
    if not isinstance(key, str) or len(_utf8(key, "key")) > 255:
        raise RequestError(400, "'key' must be a string of at most 255 bytes (a routing key)")
    partition = raw.get("partition")
    if partition is not None:
        partition = integer(partition, "partition")
    headers = field_table(raw.get("headers", {}), "headers")
    headers_fit(headers, frame_max)
    return ProducerRecord(body, key, headers, partition)


def headers_fit(headers: FieldTable, frame_max: int) -> None:
    """Headers an AMQP consumer can be sent: their content header frame within ``frame_max``
    (the broker's; 0 is no limit), as an AMQP publisher's must be (400)."""
    if not frame_max or not headers:
        return
    size = len(BasicProperties(headers=dict(headers), delivery_mode=2).encode())
    if size + CONTENT_HEADER_OVERHEAD > frame_max:
        raise RequestError(
            400,
            f"'headers' take {size} bytes: an AMQP frame (frame_max {frame_max}) cannot carry them",
        )


def _utf8(text: str, name: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise RequestError(400, f"'{name}' is not valid Unicode text") from None


def field_table(value: object, name: str, depth: int = 0) -> FieldTable:
    """A JSON object as a field table that the AMQP decoder reads back: tables and arrays
    nested at most as deep as it reads them (``MAX_TABLE_DEPTH``, counting as it counts)."""
    if not isinstance(value, dict):
        raise RequestError(400, f"'{name}' must be a JSON object")
    _check_depth(depth, name)
    for key in value:
        if len(_utf8(key, name)) > 255:
            raise RequestError(400, f"'{name}': a name is limited to 255 bytes ({key[:20]!r}...)")
    return {k: _field_value(v, name, depth + 1) for k, v in value.items()}


def _check_depth(depth: int, name: str) -> None:
    if depth >= MAX_TABLE_DEPTH:
        raise RequestError(
            400, f"'{name}': objects and arrays nested deeper than {MAX_TABLE_DEPTH} levels"
        )


def _field_value(value: object, name: str, depth: int) -> FieldValue:
    if isinstance(value, str):
        _utf8(value, name)
        return value
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise RequestError(400, f"'{name}': {value} does not fit in 64 bits")
        return value
    if isinstance(value, list):
        _check_depth(depth, name)
        return [_field_value(v, name, depth + 1) for v in value]
    if isinstance(value, dict):
        return field_table(value, name, depth)
    raise RequestError(400, f"'{name}': unsupported value {value!r}")
