"""Consuming on several connections from one process, for the benchmark suite's load generator
(``loadgen.ConsumeEach``): ``receive_each`` serves each connection's deliveries as its socket
becomes readable and acks them as ``RawClient.receive`` does (``multiple``, every N).

``STALL_SECONDS``: how long a worker waits for its broker to send anything (or to take what it
sends) before it fails, saying what it waited for, instead of hanging the run.
"""

from __future__ import annotations

import selectors
import socket
import time

from rawclient import (
    _BASIC_DELIVER,
    _FATAL,
    _U32,
    _U64,
    CHANNEL,
    RawClient,
)

from tqbroker.protocol.frames import FRAME_HEAD, FRAME_METHOD, encode_method
from tqbroker.protocol.methods import BasicAck

STALL_SECONDS = 60.0


def receive_each(clients: list[RawClient], count: int, *, ack_every: int = 100) -> None:
    """``count`` deliveries on each client's channel (``RawClient.receive`` without latency
    stamps), the clients served as their sockets become readable; ``TimeoutError`` after
    ``STALL_SECONDS`` without a byte from any."""
    selector = selectors.DefaultSelector()
    received = [0] * len(clients)
    unacked = [0] * len(clients)
    for i, client in enumerate(clients):
        client.sock.setblocking(False)
        selector.register(client.sock, selectors.EVENT_READ, i)
    head, u32, u64 = FRAME_HEAD, _U32, _U64
    left = len(clients)
    try:
        while left:
            ready = selector.select(STALL_SECONDS)
            if not ready:
                raise TimeoutError(
                    f"no delivery for {STALL_SECONDS:g} s; received {received} of {count} each"
                )
            for key, _events in ready:
                i = key.data
                client = clients[i]
                try:
                    chunk = client.sock.recv(1 << 18)
                except BlockingIOError:
                    continue
                if not chunk:
                    raise ConnectionError("the broker closed the connection")
                buf = client.buf
                buf += chunk
                pos, end = 0, len(buf)
                got, pending = received[i], unacked[i]
                while pos + 7 <= end:
                    frame_type, _channel, length = head.unpack_from(buf, pos)
                    if pos + 8 + length > end:
                        break
                    if frame_type == FRAME_METHOD:
                        ids = u32.unpack_from(buf, pos + 7)[0]
                        if ids == _BASIC_DELIVER:
                            got += 1
                            pending += 1
                            if pending >= ack_every or got == count:
                                tag_at = pos + 12 + buf[pos + 11]  # after the consumer tag
                                tag = u64.unpack_from(buf, tag_at)[0]
                                _send_ack(client.sock, tag)
                                pending = 0
                        elif ids in _FATAL:
                            client.sock.setblocking(True)
                            client._refused(pos)
                    pos += 8 + length
                del buf[:pos]
                if got >= count and received[i] < count:
                    left -= 1
                received[i], unacked[i] = got, pending
    finally:
        selector.close()
        for client in clients:
            client.sock.settimeout(STALL_SECONDS)


def _send_ack(sock: socket.socket, tag: int) -> None:
    """``basic.ack`` (``multiple``) of ``tag`` on a non-blocking socket (a few bytes: a full
    send buffer only means waiting a moment)."""
    data = memoryview(encode_method(CHANNEL, BasicAck(tag, True)))
    while data:
        try:
            data = data[sock.send(data) :]
        except BlockingIOError:
            time.sleep(0.0005)
