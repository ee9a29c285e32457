"""A client that publishes but never reads what the broker sends back must not grow the
broker's memory: the broker stops reading from it instead (TCP backpressure)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

from tqbroker.protocol.frames import (
    FRAME_BODY,
    FRAME_END_BYTE,
    FRAME_HEAD,
    FRAME_HEADER,
    PROTOCOL_HEADER,
    encode_method,
)
from tqbroker.protocol.methods import (
    BasicPublish,
    ChannelOpen,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTuneOk,
)
from tqbroker.testing import start_broker_process


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_unread_returns_do_not_grow_broker_memory(tmp_path: Path) -> None:
    broker = start_broker_process(tmp_path)
    try:
        sock = socket.create_connection((broker.host, broker.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(PROTOCOL_HEADER)
        time.sleep(0.2)
        sock.sendall(encode_method(0, ConnectionStartOk({}, "PLAIN", "\0guest\0guest", "en_US")))
        time.sleep(0.3)  # scrypt + tune
        sock.sendall(
            encode_method(0, ConnectionTuneOk(2047, 131072, 0))
            + encode_method(0, ConnectionOpen("/"))
            + encode_method(1, ChannelOpen())
        )
        time.sleep(0.2)
        before = rss_mib(broker.proc.pid)
        body = b"x" * 60_000
        publish = (
            encode_method(1, BasicPublish(exchange="", routing_key="nowhere", mandatory=True))
            + FRAME_HEAD.pack(FRAME_HEADER, 1, 14)
            + struct.pack(">HHQH", 60, 0, len(body), 0)
            + FRAME_END_BYTE
            + FRAME_HEAD.pack(FRAME_BODY, 1, len(body))
            + body
            + FRAME_END_BYTE
        )
        sent = 0
        stop = threading.Event()

        def flood() -> None:
            nonlocal sent
            sock.settimeout(1.0)
            while not stop.is_set() and sent < 4000:  # up to ~240 MB of returns
                try:
                    sock.sendall(publish)
                except TimeoutError:
                    continue  # the broker stopped reading: backpressure works
                except OSError:
                    return
                sent += 1

        thread = threading.Thread(target=flood)
        thread.start()
        time.sleep(4)
        grown = rss_mib(broker.proc.pid) - before
        stop.set()
        thread.join(timeout=5)
        # Without backpressure every unroutable message would be buffered for the return.
        assert sent < 4000, "the broker kept reading from a client that never reads"
        assert grown < 60, f"broker RSS grew by {grown:.0f} MiB"
        sock.close()
    finally:
        broker.kill()
