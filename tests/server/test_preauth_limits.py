"""What a client costs before it logs in: connections that only send the protocol header are
cheap (< 64 KiB of broker memory each) and closed by the handshake deadline; one source address
may have at most ``max_pending_handshakes_per_address`` connections in their handshake, more are
closed at once, and the broker keeps serving others meanwhile (a canary client)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.support.canary import Canary
from tqbroker.protocol.frames import PROTOCOL_HEADER
from tqbroker.testing import BrokerProcess, start_broker_process

SOURCES = [f"127.0.0.{n}" for n in range(2, 12)]  # ten loopback source addresses


def header_only(host: str, port: int, source: str) -> socket.socket:
    """A client that connects from ``source``, sends the protocol header and then nothing."""
    sock = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
    sock.sendall(PROTOCOL_HEADER)
    return sock


def reads_start(sock: socket.socket) -> bool:
    """Whether the broker answered with ``connection.start`` (a method frame on channel 0)."""
    try:
        head = sock.recv(7)
    except ConnectionResetError:
        return False
    return len(head) == 7 and head[0] == 1


def closed_by_broker(sock: socket.socket, within: float) -> bool:
    """Whether the broker closes ``sock`` within ``within`` seconds (everything it sent read)."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker process whose handshake deadline is 4 s, 50 handshakes per address."""
    config = tmp_path / "tqbroker.toml"
    config.write_text("handshake_timeout = 4\nmax_pending_handshakes_per_address = 50\n")
    args = ["--config", str(config)]
    with start_broker_process(tmp_path / "data", extra_args=args, max_open_files=4096) as running:
        yield running


def test_a_thousand_silent_clients_cost_little_and_are_closed_by_the_deadline(
    broker: BrokerProcess,
) -> None:
    with Canary(broker.host, broker.port) as canary:
        # Warm up: the first connections allocate what every later one reuses.
        for sock in [header_only(broker.host, broker.port, SOURCES[0]) for _ in range(20)]:
            assert reads_start(sock)
            sock.close()
        time.sleep(0.5)
        before = rss_kib(broker.proc.pid)
        canary.mark()
        started = time.monotonic()
        socks = [header_only(broker.host, broker.port, s) for s in SOURCES * 100]
        assert len(socks) == 1000
        answered = [reads_start(sock) for sock in socks]
        refused = answered.count(False)
        # 100 per address against a limit of 50: half of them are closed at once.
        assert refused == 500
        held = [s for s, ok in zip(socks, answered, strict=True) if ok]
        per_connection = (rss_kib(broker.proc.pid) - before) * 1024 / len(held)
        print(f"broker memory per header-only connection: {per_connection / 1024:.1f} KiB")
        assert per_connection < 64 * 1024
        canary.check()  # the broker kept serving its real client
        # The deadline (4 s from accept) closes every one of them.
        closed = [closed_by_broker(s, max(0.5, started + 8 - time.monotonic())) for s in held]
        assert all(closed)
        for sock in socks:
            sock.close()
        canary.check()


def test_an_address_over_its_handshake_limit_is_refused_while_others_are_served(
    broker: BrokerProcess,
) -> None:
    source = "127.0.0.1"
    # Connections that finished their handshake do not count: 60 against a limit of 50.
    opened = [pika.BlockingConnection(pika.URLParameters(broker.url)) for _ in range(60)]
    pending = [header_only(broker.host, broker.port, source) for _ in range(50)]
    assert all(reads_start(sock) for sock in pending)
    over = header_only(broker.host, broker.port, source)
    assert closed_by_broker(over, 2)  # at once, without a connection.start
    elsewhere = header_only(broker.host, broker.port, SOURCES[3])  # another address
    assert reads_start(elsewhere)
    for connection in opened:  # the logged-in clients are served meanwhile
        connection.channel().queue_declare("", exclusive=True)
        connection.close()
    # A connection that goes away gives its place back.
    for sock in pending[:10]:
        sock.close()
    time.sleep(0.3)
    again = [header_only(broker.host, broker.port, source) for _ in range(10)]
    assert all(reads_start(sock) for sock in again)
    for sock in [*pending, *again, over, elsewhere]:
        sock.close()
