"""Where a connection is from and to: the two ends of its TCP socket, as the log lines, the
connection registry and the admission limit name them (``127.0.0.1:41234``; ``unknown`` when
the socket can no longer say)."""

from __future__ import annotations

import trio

UNKNOWN = "unknown"


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType:
    """The TCP socket under ``stream`` (amqps: under its TLS)."""
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    assert isinstance(stream, trio.SocketStream)
    return stream.socket


def peer_address(sock: trio.socket.SocketType) -> tuple[str, int]:
    """The client's ``(host, port)``; ``("unknown", 0)`` if the socket cannot say."""
    return _address(sock, peer=True)


def local_address(sock: trio.socket.SocketType) -> tuple[str, int]:
    """The broker's ``(host, port)`` of the connection."""
    return _address(sock, peer=False)


def text(address: tuple[str, int]) -> str:
    """``127.0.0.1:5672``; ``unknown`` for an address the socket could not say."""
    host, port = address
    return UNKNOWN if host == UNKNOWN else f"{host}:{port}"


def _address(sock: trio.socket.SocketType, *, peer: bool) -> tuple[str, int]:
    try:
        found = sock.getpeername() if peer else sock.getsockname()
        return str(found[0]), int(found[1])
    except (OSError, IndexError, ValueError):
        return UNKNOWN, 0
