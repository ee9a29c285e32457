"""Probe the HTTP API's limits from outside (issue 16 item 8), against ``python -m tqbroker``
started from this checkout, with a pika canary (``queue_declare(passive=True)`` round trips)
timed while each abuse runs. Prints one line per probe.

    python benchmarks/http_abuse_probe.py [probe ...]   # probes: big, maxjson, headers, slowloris,
                                                        # idle, cap, json, stored, ints, escapes
"""

from __future__ import annotations

import base64
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pika

from tqbroker.testing import BrokerProcess, start_broker_process

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


class Canary:
    """A pika client doing queue_declare(passive) round trips in a thread: the worst latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.queue_declare("canary")
            while not self.stop.is_set():
                start = time.perf_counter()
                channel.queue_declare("canary", passive=True)
                self.latencies.append(time.perf_counter() - start)
                time.sleep(0.005)
            connection.close()
        except Exception as exc:
            self.errors.append(repr(exc))

    def __enter__(self) -> Canary:
        self.thread.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def summary(self) -> str:
        lat = sorted(self.latencies) or [float("nan")]
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return (
            f"canary n={len(lat)} p99={p99 * 1000:.1f}ms max={lat[-1] * 1000:.1f}ms "
            f"errors={self.errors[:1]}"
        )


@contextmanager
def broker(*args: str, max_open_files: int | None = None) -> Iterator[BrokerProcess]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_broker_process(Path(tmp), extra_args=args, max_open_files=max_open_files) as proc,
    ):
        yield proc


def raw(port: int, head: bytes, timeout: float = 2.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(head)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed the socket (None: still open after ``seconds``)."""
    start = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - start < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


@contextmanager
def peak_rss(pid: int) -> Iterator[list[float]]:
    """The highest RSS (MB) sampled every 10 ms while the block runs."""
    peak = [rss_mb(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], rss_mb(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


def probe_big(b: BrokerProcess) -> None:
    """An unauthenticated PUT /topics/x with 64 MiB of JSON."""
    body = b"[" + b"{}," * ((64 << 20) // 3 - 1) + b"0]"
    before = rss_mb(b.proc.pid)
    with Canary(b.url) as canary, peak_rss(b.proc.pid) as peak:
        start = time.perf_counter()
        try:
            code: object = httpx.put(
                f"{b.http_url}/topics/x",
                content=body,
                timeout=60,
                headers={"content-type": "application/json"},
            ).status_code
        except httpx.HTTPError as exc:
            code = repr(exc)
        took = time.perf_counter() - start
    print(
        f"big: {code} in {took:.2f}s; RSS {before:.0f} -> peak {peak[0]:.0f} MB; {canary.summary()}"
    )
    body = b"[" + b"[]," * ((16 << 20) // 3 - 1) + b"0]"
    with Canary(b.url) as canary:
        response = httpx.put(
            f"{b.http_url}/topics/x", content=body, timeout=60, headers={"authorization": AUTH}
        )
    print(f"big authenticated 16 MiB of []: {response.status_code}; {canary.summary()}")


def probe_maxjson(b: BrokerProcess) -> None:
    """The largest JSON bodies accepted: ~100,000 tokens (19,000 records), and one 16 MiB value
    (encoded before the canary starts: the client's own work is not the broker's)."""
    with httpx.Client(base_url=b.http_url, auth=("guest", "guest"), timeout=60) as c:
        c.put("/topics/j", json={"partitions": 1})
        records = [{"value": "x", "key": str(i)} for i in range(19_000)]
        many = json.dumps({"records": records}).encode()
        big = json.dumps({"value": "v" * (16 << 20)}).encode()
        for label, body in (("19,000 records (~95,000 tokens)", many), ("one 16 MiB value", big)):
            with Canary(b.url) as canary:
                code = c.post("/topics/j/messages", content=body).status_code
            print(f"maxjson {label}: {code}; {canary.summary()}")
        with Canary(b.url) as canary:
            connection = pika.BlockingConnection(pika.URLParameters(b.url))
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", "j-0", b"v" * (16 << 20))
            connection.close()
        print(f"baseline: the same 16 MiB value published over AMQP; {canary.summary()}")


def probe_headers(b: BrokerProcess, count: int = 2000, wait: float = 40) -> None:
    """Connections that send complete headers and never the body."""
    head = b"PUT /topics/x HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n"
    head += f"authorization: {AUTH}\r\n\r\n".encode()
    socks = []
    with Canary(b.url) as canary:
        for _ in range(count):
            try:
                socks.append(raw(b.http_port or 0, head))
            except OSError as exc:
                print(f"headers: connect failed after {len(socks)}: {exc}")
                break
        opened = time.monotonic()
        time.sleep(1)
        held = fds(b.proc.pid)
        start = time.monotonic()
        while time.monotonic() - start < wait and fds(b.proc.pid) > 100:
            time.sleep(1)
        after = fds(b.proc.pid)
        health = httpx.get(f"{b.http_url}/health", timeout=5).status_code
    print(
        f"headers-no-body x{len(socks)} (authenticated): broker fds {held} -> {after} "
        f"{time.monotonic() - opened:.0f}s after the last opened; /health {health}; "
        f"{canary.summary()}"
    )
    for s in socks:
        s.close()


def probe_slowloris(b: BrokerProcess, wait: float = 60) -> None:
    sock = raw(b.http_port or 0, b"GET /health HTTP/1.1\r\n")
    start = time.monotonic()
    gone = None
    while time.monotonic() - start < wait:
        try:
            sock.sendall(b"x-a: b\r\n")
        except OSError:
            gone = time.monotonic() - start
            break
        if closed_within(sock, 1.0) is not None:
            gone = time.monotonic() - start
            break
    print(f"slowloris headers (a line a second): closed after {gone}s (waited {wait}s)")


def probe_idle(b: BrokerProcess, wait: float = 60) -> None:
    sock = raw(b.http_port or 0, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    sock.settimeout(5)
    sock.recv(65536)
    print(f"idle keep-alive: closed after {closed_within(sock, wait)}s (waited {wait}s)")
    sock = raw(b.http_port or 0, b"")
    print(f"silent connection: closed after {closed_within(sock, wait)}s (waited {wait}s)")


def probe_cap(b: BrokerProcess, count: int = 1500) -> None:
    """Header-only connections against a broker limited to 1,024 descriptors: can a new AMQP
    client still connect?"""
    head = b"PUT /topics/x HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n"
    head += f"authorization: {AUTH}\r\n\r\n".encode()
    socks = []
    for _ in range(count):
        try:
            socks.append(raw(b.http_port or 0, head))
        except OSError as exc:
            print(f"cap: connect failed after {len(socks)}: {exc}")
            break
    time.sleep(2)
    held = fds(b.proc.pid)
    start = time.perf_counter()
    try:
        connection = pika.BlockingConnection(
            pika.URLParameters(b.url + "?socket_timeout=5&blocked_connection_timeout=5")
        )
        connection.close()
        amqp = f"ok in {time.perf_counter() - start:.3f}s"
    except Exception as exc:
        amqp = f"failed after {time.perf_counter() - start:.1f}s: {exc!r}"[:120]
    try:
        code: object = httpx.get(f"{b.http_url}/health", timeout=5).status_code
    except httpx.HTTPError as exc:
        code = repr(exc)
    print(
        f"cap: {len(socks)} header-only connections -> broker fds {held}; new AMQP {amqp}; "
        f"/health {code}"
    )
    for s in socks:
        s.close()


def show(label: str, response: httpx.Response) -> None:
    text = response.text.replace("\n", " ")
    print(f"{label}: {response.status_code} {text[:160]}")


def probe_json(b: BrokerProcess) -> None:
    with httpx.Client(base_url=b.http_url, auth=("guest", "guest"), timeout=30) as c:
        deep = b"[" * 100_000 + b"]" * 100_000
        show("deep PUT /topics/d", c.put("/topics/d", content=deep))
        deep_obj = b'{"a":' * 5000 + b"1" + b"}" * 5000
        show("deep object PUT /topics/d", c.put("/topics/d", content=deep_obj))
        show("deep POST messages", c.post("/topics/d/messages", content=deep_obj))
        show("deep PUT /api/queues", c.put("/api/queues/%2F/q", content=deep_obj))
        show(
            "deep POST /api/definitions",
            c.post(
                "/api/definitions", content=deep_obj, headers={"content-type": "application/json"}
            ),
        )
        show("deep PATCH /topics/d", c.patch("/topics/d", content=deep_obj))


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def probe_stored(b: BrokerProcess) -> None:
    with httpx.Client(base_url=b.http_url, auth=("guest", "guest"), timeout=30) as c:
        c.put("/topics/t", json={"partitions": 1})
        show(
            "headers 40 deep",
            c.post("/topics/t/messages", json={"value": "x", "headers": {"h": nested(40)}}),
        )
        show("read after", c.get("/topics/t/messages", params={"offset": 0}))


def probe_ints(b: BrokerProcess) -> None:
    big = "99999999999999999999"
    with httpx.Client(base_url=b.http_url, auth=("guest", "guest"), timeout=30) as c:
        c.put("/topics/t", json={"partitions": 1})
        show("offset big", c.get("/topics/t/messages", params={"offset": big}))
        show("partition big", c.get("/topics/t/messages", params={"partition": big}))
        show("limit big", c.get("/topics/t/messages", params={"limit": big}))
        show("max_bytes big", c.get("/topics/t/messages", params={"max_bytes": big}))
        show("timestamp big", c.get("/topics/t/messages", params={"timestamp": big}))
        show("records offset big", c.get("/topics/t/partitions/0/records", params={"offset": big}))
        show("records partition big", c.get(f"/topics/t/partitions/{big}/records"))
        show("records end big", c.get("/topics/t/partitions/0/records", params={"end": big}))
        show("offsets ts big", c.get("/topics/t/offsets", params={"timestamp": big}))
        show("put partitions big", c.put("/topics/u", json={"partitions": int(big)}))
        show("patch partitions big", c.patch("/topics/t", json={"partitions": int(big)}))
        show(
            "reset value big",
            c.post("/topics/t/groups/g/offsets", json={"to": "offset", "value": int(big)}),
        )
        show(
            "reset datetime big",
            c.post("/topics/t/groups/g/offsets", json={"to": "datetime", "value": int(big)}),
        )


def probe_escapes(b: BrokerProcess) -> None:
    with httpx.Client(base_url=b.http_url, auth=("guest", "guest"), timeout=30) as c:
        show("PUT %FF", c.put("/topics/a%FF", json={"partitions": 1}))
        show("PUT %FE", c.put("/topics/a%FE", json={"partitions": 1}))
        show("PUT %ED%A0%80", c.put("/topics/a%ED%A0%80", json={"partitions": 1}))
        show("GET /topics", c.get("/topics"))
        show("api queue %FF", c.put("/api/queues/%2F/q%FF", json={}))
        show("api vhost %FF", c.get("/api/queues/%FF"))
        show("api queue %ZZ", c.put("/api/queues/%2F/q%ZZ", json={}))


PROBES: dict[str, Callable[[BrokerProcess], None]] = {
    "big": probe_big,
    "maxjson": probe_maxjson,
    "headers": probe_headers,
    "slowloris": probe_slowloris,
    "idle": probe_idle,
    "cap": probe_cap,
    "json": probe_json,
    "stored": probe_stored,
    "ints": probe_ints,
    "escapes": probe_escapes,
}


def main() -> None:
    names = sys.argv[1:] or list(PROBES)
    for name in names:
        with broker(max_open_files=1024 if name == "cap" else None) as b:
            PROBES[name](b)


if __name__ == "__main__":
    main()
