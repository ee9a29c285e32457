"""Kafka requests over a plain socket, encoded and their responses decoded with the listener's
codec (checked against kafka-python's in ``test_codec.py``): for the requests a client library
would never send."""

from __future__ import annotations

import socket
import struct
from typing import Any

from tqbroker.protocol.kafka.messages import decode, encode
from tqbroker.protocol.kafka.schemas import REQUEST_HEADER, REQUESTS, RESPONSES
from tqbroker.protocol.kafka.wire import Reader, Writer


def exchange(raw: socket.socket, api_key: int, version: int, body: dict[str, Any]) -> Any:
    """Send one request on ``raw`` and return its decoded response."""
    writer = Writer()
    header = {"request_api_key": api_key, "request_api_version": version, "correlation_id": 3}
    encode(REQUEST_HEADER, 1, {**header, "client_id": "raw"}, writer)
    encode(REQUESTS[api_key], version, body, writer)
    raw.sendall(struct.pack(">i", len(writer.buffer)) + writer.getvalue())
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = raw.recv(65536)
        assert chunk, "closed before the answer"
        data += chunk
    reader = Reader(data[4:])
    assert reader.int32() == 3
    return decode(RESPONSES[api_key], version, reader)


def call(
    bootstrap: str,
    api_key: int,
    version: int,
    body: dict[str, Any],
    *,
    login: tuple[str, str] | None = None,
) -> Any:
    """One request on a connection of its own (after a SASL PLAIN ``login``, if given)."""
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        if login is not None:
            assert exchange(raw, 17, 1, {"mechanism": "PLAIN"})["error_code"] == 0
            token = b"\0" + login[0].encode() + b"\0" + login[1].encode()
            assert exchange(raw, 36, 1, {"auth_bytes": token})["error_code"] == 0
        return exchange(raw, api_key, version, body)
