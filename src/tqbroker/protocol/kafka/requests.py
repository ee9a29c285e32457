"""A Kafka request as it arrives, a response as it leaves: the header, then the body.

A request's header is version 2 (with tagged fields) when the request's version is flexible,
else version 1 (``client_id``, a nullable string that is never compact); a response's header is
version 1 when flexible, else 0, except ApiVersions, whose response header is always version 0
(a client must read it before it knows what the broker speaks: Kafka's
``ApiMessageTypeGenerator``, ``RequestContext``). ``decode_request`` takes a frame without its
size prefix; ``encode_response`` returns one with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, NamedTuple

from .messages import decode, encode
from .schemas import REQUEST_HEADER, REQUESTS, RESPONSE_HEADER, RESPONSES
from .wire import Malformed, Reader, Writer

API_VERSIONS = 18


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class UnknownApi(Malformed):
    """A request whose API key or version this listener does not serve (Kafka closes the
    connection, except for ApiVersions: ``header`` says what was asked)."""

    def __init__(self, header: RequestHeader, why: str) -> None:
        super().__init__(why)
        self.header = header


def decode_request(frame: bytes) -> tuple[RequestHeader, dict[str, Any]]:
    """The header and body of one request (``UnknownApi``, or ``ValueError`` for bytes that do
    not decode)."""
    peek = Reader(frame)
    api_key, api_version, correlation_id = peek.int16(), peek.int16(), peek.int32()
    header = RequestHeader(api_key, api_version, correlation_id, None)
    schema = REQUESTS.get(api_key)
    if schema is None:
        raise UnknownApi(header, f"API key {api_key} is not served")
    if not schema.valid[0] <= api_version <= schema.valid[1]:
        with contextlib.suppress(Malformed):  # its header's version is unknown too: read as 1
            header = header._replace(
                client_id=decode(REQUEST_HEADER, 1, Reader(frame))["client_id"]
            )
        raise UnknownApi(header, f"{schema.name} version {api_version} is not served")
    reader = Reader(frame)
    fields = decode(REQUEST_HEADER, 2 if schema.is_flexible(api_version) else 1, reader)
    return header._replace(client_id=fields["client_id"]), decode(schema, api_version, reader)


def encode_response(header: RequestHeader, body: Mapping[str, Any]) -> bytes:
    """The response to the request ``header`` describes, size prefix first."""
    schema = RESPONSES[header.api_key]
    version = header.api_version
    flexible = schema.is_flexible(version) and header.api_key != API_VERSIONS
    writer = Writer()
    writer.int32(0)  # the size, set below
    encode(RESPONSE_HEADER, 1 if flexible else 0, {"correlation_id": header.correlation_id}, writer)
    encode(schema, version, body, writer)
    buffer = writer.buffer
    buffer[0:4] = (len(buffer) - 4).to_bytes(4, "big")
    return bytes(buffer)
