"""A free loopback port for a program that must be told its port before it starts (etcd,
RabbitMQ, a node behind a proxy): the kernel's pick for a socket bound to port 0, closed again
(another program may take it in between: rare on loopback, and such a start fails loudly)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
