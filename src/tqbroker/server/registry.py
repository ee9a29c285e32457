"""The open AMQP connections, by the name RabbitMQ gives them (``"127.0.0.1:41234 ->
127.0.0.1:5672"``): ``serve`` registers each accepted connection for its lifetime, and the
addresses it listens on; the management API lists them, shows them and closes them by name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import attrs

from .addresses import local_address, peer_address
from .connection import AMQPConnection


@attrs.frozen
class Registered:
    """A connection, its name, where it is and when it was accepted."""

    name: str
    connection: AMQPConnection
    peer_host: str
    peer_port: int
    host: str
    port: int
    connected_at_ms: int


class Connections:
    """The open connections by name, and the node's listeners (``(protocol, ip, port)``, for
    the management API's overview and port health check)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Registered] = {}
        self._names: dict[AMQPConnection, str] = {}
        self.listeners: list[tuple[str, str, int]] = []

    def add(self, connection: AMQPConnection) -> Registered:
        peer_host, peer_port = peer_address(connection.socket)
        host, port = local_address(connection.socket)
        name = base = f"{peer_host}:{peer_port} -> {host}:{port}"
        n = 1
        while name in self._by_name:  # an address that could not be read ("unknown:0")
            n += 1
            name = f"{base} ({n})"
        entry = Registered(
            name, connection, peer_host, peer_port, host, port, int(time.time() * 1000)
        )
        self._by_name[name] = entry
        self._names[connection] = name
        return entry

    def discard(self, connection: AMQPConnection) -> None:
        name = self._names.pop(connection, None)
        if name is not None and self._by_name[name].connection is connection:
            del self._by_name[name]

    def get(self, name: str) -> Registered | None:
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[Registered]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)
