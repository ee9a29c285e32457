"""Every 4xx/5xx path of the HTTP API, table-driven, with httpx over loopback while a pika canary
keeps doing round trips: each bad request gets its status and a one-line JSON error (never a
traceback); out-of-range integers, malformed percent-encoding, JSON too deep or too big and
headers AMQP could not carry are refused; a stored record whose headers no longer decode is
still read; a 500 says "internal error" and nothing of the exception."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import attrs
import httpx
import pytest
import trio
from starlette.requests import Request
from starlette.routing import Route

from tests.support.canary import Canary
from tqbroker.broker.broker import Broker
from tqbroker.broker.streams import topics
from tqbroker.broker.streams.topics import ProducerRecord
from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.recordbatch import BinaryColumn, WriteBatch, encode_write
from tqbroker.server.http import create_app
from tqbroker.server.http.inputs import MAX_REQUEST_BYTES
from tqbroker.server.http.jsonbody import MAX_JSON_VALUES
from tqbroker.server.http.limits import serve
from tqbroker.server.registry import Connections
from tqbroker.testing import RunningBroker, running_broker, start_broker

pytestmark = pytest.mark.timeout(60)

USERS = (
    UserConfig(
        "guest",
        "guest",
        tags=("administrator",),
        permissions={"/": PermissionConfig(), "other": PermissionConfig()},
    ),
    UserConfig("limited", "secret", tags=("management",), permissions={"/": PermissionConfig()}),
)
BIG = "99999999999999999999"


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def large(record: bytes) -> bytes:
    """A produce body of the record 9,000 times (over 64 KiB: parsed piecewise)."""
    return b'{"records": [' + record * 9000 + b"]}"


def tqw1(headers: bytes = b"", key: bytes = b"k") -> bytes:
    return encode_write(
        WriteBatch(
            partitions=__import__("array").array("i", [-1]),
            keys=BinaryColumn.of([key]),
            values=BinaryColumn.of([b"v"]),
            headers=BinaryColumn.of([headers]),
        )
    )


@attrs.frozen
class Case:
    name: str
    method: str
    path: str
    status: int
    says: str  # in the error's message (or reason)
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    auth: tuple[str, str] | None = ("guest", "guest")


def c(name: str, method: str, path: str, status: int, says: str, **kwargs: Any) -> Case:
    auth = kwargs.pop("auth", ("guest", "guest"))
    return Case(name, method, path, status, say(says), kwargs, auth)


def say(words: str) -> str:
    return {"64": "does not fit in 64 bits", "deep": "nested too deep"}.get(words, words)


M = "/topics/t/messages"
R = "/topics/t/partitions/0/records"
G = "/topics/t/groups/g/offsets"
W = "/topics/t/records"
Q = "/api/queues/%2F/q"
H = {"value": "x"}
MANY = b"[" + b"0," * MAX_JSON_VALUES + b"0]"
WRONG = ("guest", "x")
LIMITED = ("limited", "secret")
OTHER = {"vhost": "other"}
EARLIEST = {"to": "earliest"}
WIDE = b'{"h": "' + b"y" * 5000 + b'"}'  # headers over a 4096-byte frame

# fmt: off
CASES = [
    # 401: no or wrong credentials; 403: a vhost the user may not open.
    c("no credentials", "GET", M, 401, "credentials", auth=None),
    c("wrong password", "POST", M, 401, "refused", json={}, auth=WRONG),
    c("api no credentials", "GET", "/api/queues", 401, "Login failed", auth=None),
    c("other vhost", "GET", "/topics/t/offsets", 403, "no access", params=OTHER, auth=LIMITED),
    # 404: unknown topic, partition, vhost, path, queue.
    c("unknown topic", "GET", "/topics/nope/offsets", 404, "nope"),
    c("unknown partition", "GET", M, 404, "partitions", params={"partition": "7"}),
    c("unknown vhost", "GET", "/topics/t/offsets", 404, "no vhost", params={"vhost": "nope"}),
    c("unknown path", "GET", "/nothing/here", 404, "Not Found"),
    c("api unknown queue", "GET", "/api/queues/%2F/nope", 404, "Not Found"),
    # 405: a method the path does not take.
    c("method", "DELETE", M, 405, "Method Not Allowed"),
    # 400: bodies.
    c("not JSON", "PUT", "/topics/u", 400, "not JSON", content=b"{nope"),
    c("not an object", "PUT", "/topics/u", 400, "JSON object", content=b"[1]"),
    c("NaN", "PUT", "/topics/u", 400, "not a JSON number", content=b'{"partitions": NaN}'),
    c("not UTF-8", "PUT", "/topics/u", 400, "not JSON", content=b'{"a": "\xff"}'),
    c("deep JSON", "PUT", "/topics/u", 400, "deep", content=b"[" * 100_000),
    c("deep object", "PATCH", "/topics/t", 400, "deep", json=nested(70)),
    # Bodies of 64 KiB or more are parsed piecewise (jsonbody.parse_json_paced): same answers.
    c("large, bad", "POST", M, 400, "not JSON", content=large(b'{"value": "x"},')),
    c("large, deep", "POST", M, 400, "deep", json={"records": [{"headers": nested(70)}] * 600}),
    c("large, NaN", "POST", M, 400, "not a JSON number", content=large(b'{"value": NaN},')),
    c("api deep JSON", "PUT", Q, 400, "deep", json=nested(70)),
    c("api deep JSON 2", "PUT", "/api/exchanges/%2F/e", 400, "deep", content=b"[" * 100_000),
    c("partitions text", "PUT", "/topics/u", 400, "must be an integer", json={"partitions": "a"}),
    c("partitions bool", "PUT", "/topics/u", 400, "must be an integer", json={"partitions": True}),
    c("partitions 0", "PUT", "/topics/u", 400, "between 1 and", json={"partitions": 0}),
    c("partitions huge", "PUT", "/topics/u", 400, "64", json={"partitions": int(BIG)}),
    c("arguments list", "PUT", "/topics/u", 400, "must be a JSON object", json={"arguments": [1]}),
    c("no records", "POST", M, 400, "non-empty list", json={"records": []}),
    c("no value", "POST", M, 400, "'value' string", json={"key": "k"}),
    c("bad base64", "POST", M, 400, "not valid base64", json={**H, "encoding": "base64"}),
    c("bad encoding", "POST", M, 400, "'encoding'", json={**H, "encoding": "rot13"}),
    c("lone surrogate", "POST", M, 400, "not valid Unicode", content=b'{"value": "\\ud800"}'),
    c("long key", "POST", M, 400, "255 bytes", json={**H, "key": "k" * 256}),
    c("headers 33 deep", "POST", M, 400, "deeper than 32", json={**H, "headers": nested(33)}),
    c("header int 2**64", "POST", M, 400, "64 bits", json={**H, "headers": {"h": 2**64}}),
    c("header name 256", "POST", M, 400, "255 bytes", json={**H, "headers": {"h" * 256: 1}}),
    c("headers list", "POST", M, 400, "must be a JSON object", json={**H, "headers": [1]}),
    c("headers > frame", "POST", M, 400, "cannot carry", json={**H, "headers": {"h": "y" * 5000}}),
    c("TQW1 headers > frame", "POST", W, 400, "cannot carry", content=tqw1(WIDE)),
    c("partition text", "POST", M, 400, "must be an integer", json={**H, "partition": "p"}),
    c("api arguments deep", "PUT", Q, 400, "deeper than 32", json={"arguments": nested(33)}),
    c("api header int", "POST", "/api/exchanges/%2F/amq.direct/publish", 400, "64 bits",
      json={"routing_key": "r", "payload": "p", "payload_encoding": "string",
            "properties": {"headers": {"h": 2**64}}}),
    # 400: query parameters.
    c("offset huge", "GET", M, 400, "64", params={"offset": BIG}),
    c("offset negative", "GET", M, 400, "'offset' must be >= 0", params={"offset": "-1"}),
    c("offset text", "GET", M, 400, "'offset' must be an integer", params={"offset": "x"}),
    c("offset long text", "GET", M, 400, "a long text", params={"offset": "1" * 5000}),
    c("partition huge", "GET", M, 400, "64", params={"partition": BIG}),
    c("limit 0", "GET", M, 400, "limit must be between", params={"limit": "0"}),
    c("limit huge", "GET", M, 400, "64", params={"limit": BIG}),
    c("max_bytes huge", "GET", M, 400, "64", params={"max_bytes": BIG}),
    c("timestamp huge", "GET", M, 400, "64", params={"timestamp": BIG}),
    c("timestamp text", "GET", M, 400, "ISO-8601", params={"timestamp": "soon"}),
    c("offset and timestamp", "GET", M, 400, "not both", params={"offset": 0, "timestamp": 0}),
    c("offsets timestamp huge", "GET", "/topics/t/offsets", 400, "64", params={"timestamp": BIG}),
    c("records offset huge", "GET", R, 400, "64", params={"offset": BIG}),
    c("records end huge", "GET", R, 400, "64", params={"end": BIG}),
    c("records partition huge", "GET", f"/topics/t/partitions/{BIG}/records", 400, "64"),
    c("records partition text", "GET", "/topics/t/partitions/p/records", 400, "an integer"),
    c("reset no target", "POST", G, 400, "'to' must be one of", json={}),
    c("reset value huge", "POST", G, 400, "64", json={"to": "offset", "value": int(BIG)}),
    c("reset datetime huge", "POST", G, 400, "64", json={"to": "datetime", "value": int(BIG)}),
    c("reset dry_run", "POST", G, 400, "'dry_run'", json={"to": "earliest", "dry_run": "yes"}),
    c("reset partitions", "POST", G, 400, "must be a list", json={**EARLIEST, "partitions": 1}),
    c("alter no count", "PATCH", "/topics/t", 400, "partition count", json={}),
    c("alter shrink", "PATCH", "/topics/t", 400, "", json={"partitions": 1}),
    c("producer sequence", "POST", W, 400, "x-producer-sequence", content=tqw1(),
      headers={"x-producer-id": "p", "x-producer-sequence": BIG}),
    # 400: the columnar write.
    c("not TQW1", "POST", W, 400, "not a valid TQW1", content=b"nope"),
    c("TQW1 deep headers", "POST", W, 400, "deep", content=tqw1(b"[" * 100_000)),
    c("TQW1 bad key", "POST", W, 400, "record 0", content=tqw1(key=b"\xff")),
    # 400: paths whose percent-encoding is malformed or not UTF-8.
    c("%FF", "PUT", "/topics/a%FF", 400, "UTF-8", json={}),
    c("%FE", "PUT", "/topics/a%FE", 400, "UTF-8", json={}),
    c("surrogate", "GET", "/topics/a%ED%A0%80/offsets", 400, "UTF-8"),
    c("bad escape", "GET", "/topics/a%ZZ/offsets", 400, "two hex digits"),
    c("api %FF", "PUT", "/api/queues/%2F/q%FF", 400, "UTF-8", json={}),
    c("api vhost %FE", "GET", "/api/queues/%FE", 400, "UTF-8"),
    c("api bad escape", "PUT", "/api/queues/%2F/q%G0", 400, "two hex digits", json={}),
    # 409: a topic declared again with another partition count.
    c("redeclare", "PUT", "/topics/t", 409, "", json={"partitions": 5}),
    # 413: too big.
    c("too many values", "POST", M, 413, "JSON values", content=MANY),
    c("api too many values", "PUT", Q, 413, "JSON values", content=MANY),
    c("value too big", "POST", M, 413, "limited to", json={"value": "x" * 1025}),
]
# fmt: on


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    config = BrokerConfig(
        port=0,
        data_dir=tmp_path_factory.mktemp("data"),
        vhosts=("/", "other"),
        users=USERS,
        max_message_size=1024,
        frame_max=4096,
    )
    with (
        running_broker(config) as running,
        httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as http,
    ):
        assert http.put("/topics/t", json={"partitions": 2}).status_code == 201
        assert (
            http.put("/topics/t", json={"partitions": 2}, params={"vhost": "other"}).status_code
            == 201
        )
        yield running


@pytest.fixture(scope="module")
def canary(broker: RunningBroker) -> Iterator[Canary]:
    with Canary(broker.host, broker.port) as watching:
        yield watching


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_error_path(broker: RunningBroker, canary: Canary, case: Case) -> None:
    canary.mark()
    with httpx.Client(base_url=broker.http_url, timeout=30) as http:
        kwargs = dict(case.kwargs)
        if case.auth is not None:
            kwargs["auth"] = case.auth
        response = http.request(case.method, case.path, **kwargs)
    assert response.status_code == case.status, response.text[:300]
    body = response.json()
    assert body["error"], body
    text = body.get("message", body.get("reason", ""))
    assert case.says in text, body
    assert "Traceback" not in response.text
    assert "\n" not in text
    canary.check(min_round_trips=1)


def test_headers_as_deep_as_amqp_allows_are_stored(broker: RunningBroker) -> None:
    """The limit is AMQP's own (32 levels of tables and arrays): at it, stored and read back."""
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        landed = http.post(M, json={"value": "deep", "headers": nested(32), "partition": 1})
        assert landed.status_code == 201, landed.text
        read = http.get(M, params={"partition": 1, "offset": landed.json()["offset"]})
    assert read.json()["messages"][0]["headers"] == nested(32)


def test_a_body_declared_too_big_is_refused_unread(broker: RunningBroker) -> None:
    """A Content-Length over the limit: 413 before a byte of the body is sent."""
    credentials = base64.b64encode(b"guest:guest")
    head = (
        b"POST /topics/t/records HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n"
        b"authorization: Basic %s\r\n\r\n" % (MAX_REQUEST_BYTES + 1, credentials)
    )
    with socket.create_connection((broker.host, broker.http_port or 0), timeout=5) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):  # until the server closes: it reads no body
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"limited to" in answer


def test_the_percent_escapes_name_no_topic(broker: RunningBroker) -> None:
    """Before, ``%FF`` and ``%FE`` both decoded to U+FFFD: one topic under two names."""
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        names = [t["topic"] for t in http.get("/topics").json()]
    assert all("\ufffd" not in name for name in names), names


async def test_a_stored_record_whose_headers_no_longer_decode_is_read(tmp_path: Path) -> None:
    """A record stored with headers deeper than AMQP reads (written below the HTTP checks, as
    an earlier version could) is still read, JSON and columnar, its headers replaced by a
    note."""
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, BrokerConfig(port=0, data_dir=tmp_path))
        assert running.broker is not None
        vhost = running.broker.vhosts["/"]
        await topics.declare(vhost, "t", 1, {})
        await topics.produce(vhost, "t", [ProducerRecord(b"x", "k", {"h": nested(40)})])
        await topics.produce(vhost, "t", [ProducerRecord(b"y", "k", {"h": 1})])
        async with httpx.AsyncClient(base_url=running.http_url, auth=("guest", "guest")) as http:
            read = await http.get("/topics/t/messages", params={"offset": 0})
            assert read.status_code == 200, read.text
            first, second = read.json()["messages"]
            assert "x-undecodable-headers" in first["headers"], first
            assert second["headers"] == {"h": 1}
            columns = await http.get(
                "/topics/t/partitions/0/records", params={"offset": 0, "headers": "true"}
            )
            assert columns.status_code == 200, columns.text
            assert b"x-undecodable-headers" in columns.content
        nursery.cancel_scope.cancel()


async def test_a_500_carries_no_traceback() -> None:
    """A route that fails (here one added to the real app that raises with a secret in its
    message) answers 500 with "internal error" and nothing of the exception."""

    async def broken(request: Request) -> None:
        raise RuntimeError("secret-password in a traceback")

    config_only = cast(Broker, SimpleNamespace(config=BrokerConfig()))
    app = create_app(config_only, cast(Connections, None))
    app.router.routes.insert(0, Route("/broken", broken))
    import hypercorn.config

    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config, 10)
        async with httpx.AsyncClient(base_url=binds[0]) as http:
            response = await http.get("/broken")
        nursery.cancel_scope.cancel()
    assert response.status_code == 500
    assert response.json()["error"] == "internal_error"
    assert "secret" not in response.text
    assert "Traceback" not in response.text
    assert base64.b64encode(b"secret").decode() not in response.text
