"""The HTTP server's limits, probed over raw loopback sockets against ``python -m tqbroker`` in a
child process (its descriptors and memory are its own), with a pika canary doing round trips
throughout: credentials are checked before any body is read, header-only and trickling
requests are answered 408 and closed, slow headers and idle keep-alive connections are closed,
connections over ``http_max_connections`` are answered 503 at once."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import httpx
import pytest
from starlette.routing import Route

from tests.support.canary import Canary
from tests.support.polling import eventually
from tqbroker.broker.broker import Broker
from tqbroker.config import BrokerConfig
from tqbroker.server.http import create_app
from tqbroker.server.http.limits import REFUSAL_SECONDS
from tqbroker.server.registry import Connections
from tqbroker.testing import BrokerProcess, start_broker_process

pytestmark = pytest.mark.timeout(90)

MAX_CONNECTIONS = 40
IDLE_TIMEOUT = 1.5
BODY_TIMEOUT = 1.0
# A canary round trip slower than this while the abuse runs fails the test (before these
# limits, the abuse froze AMQP clients for seconds).
CANARY_LATENCY = 0.5
AUTH = b"authorization: Basic " + base64.b64encode(b"guest:guest") + b"\r\n"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TQBROKER_HTTP_MAX_CONNECTIONS", str(MAX_CONNECTIONS))
        env.setenv("TQBROKER_HTTP_IDLE_TIMEOUT", str(IDLE_TIMEOUT))
        env.setenv("TQBROKER_HTTP_BODY_TIMEOUT", str(BODY_TIMEOUT))
        with start_broker_process(tmp_path_factory.mktemp("data")) as proc:
            yield proc


@pytest.fixture
def canary(broker: BrokerProcess) -> Iterator[Canary]:
    with Canary(broker.host, broker.port) as watching:
        yield watching
        watching.check()
        assert watching.max_latency < CANARY_LATENCY, watching.max_latency


def connect(broker: BrokerProcess, head: bytes = b"") -> socket.socket:
    sock = socket.create_connection((broker.host, broker.http_port or 0), timeout=5)
    if head:
        sock.sendall(head)
    return sock


def response(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the connection (or ``timeout``: then a
    ``TimeoutError``)."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def closed_after(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closed ``sock`` (fails beyond ``limit``)."""
    start = time.monotonic()
    response(sock, limit)
    return time.monotonic() - start


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def open_descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def body_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the HTTP API that takes a request body."""
    config_only = cast(Broker, SimpleNamespace(config=BrokerConfig()))  # the app keeps it
    app = create_app(config_only, cast(Connections, None))
    found = []
    for route in app.routes:
        if not isinstance(route, Route):
            continue
        path = route.path.replace("{vhost}", "%2F")
        while "{" in path:
            start = path.index("{")
            path = path[:start] + "x" + path[path.index("}", start) + 1 :]
        found += [
            (m, path)
            for m in sorted(route.methods or ())
            if m in ("PUT", "POST", "PATCH", "DELETE")
        ]
    return found


def test_credentials_are_checked_before_a_body_is_read(
    broker: BrokerProcess, canary: Canary
) -> None:
    """Every route that takes a body answers 401 to a request without (valid) credentials
    while the body it announced (50 MB) has not been sent at all, and says ``connection:
    close``: the server closes the connection after it, and a client told nothing would send
    its next request on that connection (httpx then sees "Server disconnected")."""
    routes = body_routes()
    assert len(routes) >= 15, routes  # the table was found
    wrong = b"authorization: Basic " + base64.b64encode(b"guest:wrong") + b"\r\n"

    def ask(method: str, path: str, credentials: bytes) -> tuple[str, str, bytes]:
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            "content-length: 50000000\r\n"
        ).encode()
        with connect(broker, head + credentials + b"\r\n") as sock:
            return method, path, response(sock, 10)

    # In parallel: a failed login may be answered after a delay.
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda a: ask(*a), [(*r, c) for r in routes for c in (b"", wrong)]))
    for method, path, data in answers:
        # 401; or 429 should a failed-login rate limit answer first: never the body read.
        assert status(data) in (401, 429), (method, path, data[:200])
        head = data.partition(b"\r\n\r\n")[0].lower()
        assert b"\r\nconnection: close" in head, (method, path, head)


def test_an_unauthenticated_huge_body_costs_no_memory(
    broker: BrokerProcess, canary: Canary
) -> None:
    """64 MiB of JSON without credentials: the 401 comes before a byte of the body is sent,
    the server closes the connection, the broker's RSS stays flat (before: it parsed the body,
    1.7 GB)."""
    before = rss_mb(broker.proc.pid)
    head = b"PUT /topics/x HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (64 << 20)
    with connect(broker, head) as sock:
        sock.settimeout(5)
        assert status(sock.recv(65536)) == 401
        chunk = b"[" + b"{}," * 100_000
        sent = 0
        try:
            while sent < 64 << 20:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the server has closed the connection
            pass
        assert sent < 64 << 20, "the server read the whole body"
    assert rss_mb(broker.proc.pid) - before < 16


def test_a_body_that_does_not_come_is_answered_408(broker: BrokerProcess, canary: Canary) -> None:
    """Complete headers and then nothing, or a trickle: 408 and closed within the body
    timeout; the descriptors are released (before: held for ever)."""
    baseline = open_descriptors(broker.proc.pid)
    head = b"PUT /topics/x HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n" + AUTH + b"\r\n"
    socks = [connect(broker, head) for _ in range(MAX_CONNECTIONS // 2)]
    trickle = connect(broker, head)
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.2):
            try:
                trickle.sendall(b" ")
            except OSError:
                return

    dripping = threading.Thread(target=drip)
    dripping.start()
    try:
        for sock in [*socks, trickle]:
            data = response(sock, BODY_TIMEOUT + 3)
            assert status(data) == 408, data[:200]
            assert b"did not arrive" in data
            assert b"\r\nconnection: close" in data.partition(b"\r\n\r\n")[0].lower()
    finally:
        stop.set()
        dripping.join()
        for sock in [*socks, trickle]:
            sock.close()
    eventually(lambda: open_descriptors(broker.proc.pid) <= baseline + 2, 5)


def test_a_slow_but_steady_body_is_read(broker: BrokerProcess, canary: Canary) -> None:
    """A body that keeps coming (32 KiB every 0.1 s, 2 s in all: longer than the body timeout)
    is read: the deadline grows with what arrives."""
    records = b'{"records": [' + b",".join([b'{"value": "%s"}' % (b"v" * 1000)] * 640) + b"]}"
    httpx.put(f"{broker.http_url}/topics/steady", auth=("guest", "guest"), json={})
    head = b"POST /topics/steady/messages HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n" % len(
        records
    )
    with connect(broker, head + AUTH + b"\r\n") as sock:
        for start in range(0, len(records), 32 * 1024):
            sock.sendall(records[start : start + 32 * 1024])
            time.sleep(0.1)
        sock.settimeout(5)
        assert status(sock.recv(65536)) == 201


def test_slow_headers_and_idle_connections_are_closed(
    broker: BrokerProcess, canary: Canary
) -> None:
    """A request head sent a line at a time, a connection that sends nothing, a keep-alive
    connection after its response: each closed once the idle timeout has passed."""
    slow = connect(broker, b"GET /health HTTP/1.1\r\n")
    silent = connect(broker)
    idle = connect(broker, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    idle.settimeout(5)
    assert status(idle.recv(65536)) == 200
    start = time.monotonic()
    try:
        while time.monotonic() - start < IDLE_TIMEOUT + 3:
            slow.sendall(b"x-slow: 1\r\n")
            time.sleep(0.2)
    except OSError:
        pass
    took = time.monotonic() - start
    assert IDLE_TIMEOUT - 0.3 < took < IDLE_TIMEOUT + 1, took
    for sock in (silent, idle):
        assert closed_after(sock, IDLE_TIMEOUT + 1) < IDLE_TIMEOUT + 1
    for sock in (slow, silent, idle):
        sock.close()


def test_connections_over_the_cap_are_refused(broker: BrokerProcess, canary: Canary) -> None:
    """With ``http_max_connections`` open, the next one is answered 503 and closed at once;
    the broker holds no more descriptors than the cap; once they close, requests are served
    again."""
    baseline = open_descriptors(broker.proc.pid)
    held = [connect(broker, b"GET /health HTTP/1.1\r\n") for _ in range(MAX_CONNECTIONS)]
    eventually(lambda: open_descriptors(broker.proc.pid) >= baseline + MAX_CONNECTIONS)
    start = time.monotonic()
    refused = [connect(broker, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n") for _ in range(100)]
    for sock in refused:
        data = response(sock, 2)
        assert status(data) == 503, data[:200]
        assert b"more than 40 HTTP connections" in data
    assert time.monotonic() - start < 2
    # A refused connection is drained for at most REFUSAL_SECONDS (then closed, though this
    # client keeps its end open): the broker holds the cap's descriptors, no more.
    eventually(
        lambda: open_descriptors(broker.proc.pid) <= baseline + MAX_CONNECTIONS + 2,
        REFUSAL_SECONDS + 5,
    )
    for sock in [*held, *refused]:
        sock.close()
    eventually(
        lambda: httpx.get(f"{broker.http_url}/health", timeout=1).status_code == 200,
        5,
        what="/health served again after the connections closed",
        ignoring=(httpx.HTTPError,),
    )
