"""A failed-login flood (run as a script by test_logins.py, in its own process so that its work
does not share the test process's interpreter lock with the broker): ``THREADS`` threads each
for AMQP (PLAIN with a wrong password over a raw socket) and HTTP (Basic with a wrong password)
until ``SECONDS`` have passed; prints the attempts made."""

from __future__ import annotations

import base64
import http.client
import socket
import struct
import sys
import threading
import time

HOST = "127.0.0.1"


def _frame(payload: bytes) -> bytes:
    return struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"


def _start_ok(user: str, password: str) -> bytes:
    response = f"\0{user}\0{password}".encode()
    mechanism = b"PLAIN"
    args = struct.pack(">I", 0)  # client properties: an empty table
    args += bytes([len(mechanism)]) + mechanism
    args += struct.pack(">I", len(response)) + response
    args += bytes([5]) + b"en_US"
    return _frame(struct.pack(">HH", 10, 11) + args)


def amqp(port: int, until: float, counts: list[int]) -> None:
    while time.monotonic() < until:
        try:
            with socket.create_connection((HOST, port), timeout=5) as sock:
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                sock.recv(4096)  # connection.start
                sock.sendall(_start_ok("guest", "wrong"))
                while sock.recv(4096):  # refused: closed by the broker
                    pass
        except OSError:
            pass
        counts[0] += 1


def web(port: int, until: float, counts: list[int]) -> None:
    token = base64.b64encode(b"guest:wrong").decode()
    while time.monotonic() < until:
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            conn.request("GET", "/api/overview", headers={"authorization": f"Basic {token}"})
            conn.getresponse().read()
            conn.close()
        except OSError:
            pass
        counts[1] += 1


def main() -> None:
    amqp_port, http_port, threads, seconds = map(float, sys.argv[1:5])
    until = time.monotonic() + seconds
    counts = [0, 0]
    workers = [
        threading.Thread(target=target, args=(int(port), until, counts))
        for target, port in ((amqp, amqp_port), (web, http_port))
        for _ in range(int(threads))
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(counts[0], counts[1])


if __name__ == "__main__":
    main()
