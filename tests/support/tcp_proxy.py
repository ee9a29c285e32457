"""A TCP proxy a fault test puts between two parts (a node and etcd, a node and the nodes that
fetch from it), on a loopback port of its own, in a thread of its own (``running_proxy``).

``cut()`` is a network partition as TCP sees it: nothing crosses any more, either way, on open
connections or new ones (those are accepted, and wait), yet nothing is lost or closed: bytes in
flight wait in the proxy as they would in retransmissions, and a peer notices only by its own
timeouts. ``heal()`` lets everything through again; connections the peers gave up on meanwhile
end then. ``reset()`` closes every open connection (a peer restarted behind a firewall)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import trio

CHUNK = 65536


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = 0
        self._open = trio.Event()
        self._open.set()
        self._connections: set[trio.CancelScope] = set()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stopped = trio.Event()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def cut(self) -> None:
        self._call(self._cut)

    def heal(self) -> None:
        self._call(self._open.set)

    def stop(self) -> None:
        self._call(self._stopped.set)

    def reset(self) -> None:
        self._call(lambda: [scope.cancel() for scope in self._connections])

    def _cut(self) -> None:
        if self._open.is_set():
            self._open = trio.Event()

    def _call(self, action: object) -> None:
        assert self._token is not None, "the proxy is not running"
        trio.from_thread.run_sync(action, trio_token=self._token)  # type: ignore[arg-type]

    async def run(self, started: threading.Event) -> None:
        self._token = trio.lowlevel.current_trio_token()
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._serve, listeners)
            started.set()
            await self._stopped.wait()
            nursery.cancel_scope.cancel()

    async def _serve(self, client: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self._connections.add(scope)
            try:
                await self._passable()
                upstream = await trio.open_tcp_stream(*self.target)
                async with client, upstream, trio.open_nursery() as pumps:
                    pumps.start_soon(self._pump, client, upstream, pumps.cancel_scope)
                    pumps.start_soon(self._pump, upstream, client, pumps.cancel_scope)
            except OSError:
                pass  # the target is down, or a side went away: this connection ends
            finally:
                self._connections.discard(scope)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope
    ) -> None:
        try:
            while True:
                await self._passable()
                data = await source.receive_some(CHUNK)
                if not data:
                    break
                await self._passable()  # cut while receiving: the bytes wait here
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        both.cancel()  # one side closed: so does the other

    async def _passable(self) -> None:
        while not self._open.is_set():
            await self._open.wait()


@contextmanager
def running_proxy(
    target_host: str, target_port: int, host: str = "127.0.0.1"
) -> Iterator[TcpProxy]:
    """A proxy to ``target_host:target_port`` on a port of its own on ``host`` (a loopback
    address), until the end."""
    proxy = TcpProxy(target_host, target_port, host)
    started = threading.Event()
    thread = threading.Thread(target=trio.run, args=(proxy.run, started), daemon=True)
    thread.start()
    assert started.wait(10), "the proxy did not start"
    try:
        yield proxy
    finally:
        proxy.stop()
        thread.join(10)
