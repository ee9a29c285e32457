"""A node's links to the other nodes of its cluster: the server other nodes call, and one
client per node (``peer_link.py``), found through the nodes' records in the cluster view.

Responsibilities:
- ``serve``: the node-to-node listener, answering the operations this node offers (``fetch``:
  a follower's fetch from a leader here);
- ``client``: the link to a node, made from its record's ``peer`` address (``host:port``) and
  made again when the address changes (the node restarted elsewhere);
- ``fetch_from``: a follower's fetch over the link, in the shape ``roles.py`` asks for;
- ``forward_to``: a forwarded publish's request to a leader (``forwarding.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from .fetch import FetchRequest, FetchResponse
from .follower import Fetch
from .forwarding import Send
from .peer_link import (
    LinkSettings,
    PeerClient,
    PeerError,
    PeerServer,
    PeerUnavailable,
    connect_tcp,
    serve_tcp,
)
from .view import ClusterView

log = logging.getLogger(__name__)

Operation = Callable[[str, Any], Awaitable[Any]]  # (the calling node, body) -> reply body
FETCH = "fetch"


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 host) as its parts; ``ValueError`` if not."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class PeerLinks:
    """One node's links (see the module doc). ``secret`` is set before the first use."""

    def __init__(
        self, node_id: str, view: ClusterView, settings: LinkSettings | None = None
    ) -> None:
        self.node_id = node_id
        self.view = view
        self.settings = settings or LinkSettings()
        self.secret = b""
        self._clients: dict[str, tuple[str, PeerClient]] = {}  # node -> (address, client)

    async def serve(
        self,
        host: str,
        port: int,
        operations: Mapping[str, Operation],
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (0: ephemeral; the bound port is reported) until cancelled."""

        async def handle(peer: str, op: str, body: Any) -> Any:
            operation = operations.get(op)
            if operation is None:
                raise PeerError("unknown_operation", f"no operation {op!r} on node {self.node_id}")
            return await operation(peer, body)

        server = PeerServer(self.node_id, self.secret, handle, self.settings)
        try:
            await serve_tcp(server, host, port, task_status=task_status)
        finally:
            with trio.CancelScope(shield=True):
                await self.aclose()

    def client(self, node: str) -> PeerClient:
        """The link to ``node``; ``PeerUnavailable`` if the view has no address for it."""
        record = self.view.nodes.get(node)
        if record is None or not record.peer:
            raise PeerUnavailable(f"node {node} is not registered (no link address)")
        found = self._clients.get(node)
        if found is not None and found[0] == record.peer:
            return found[1]
        if found is not None:
            self._clients.pop(node)
            trio.lowlevel.spawn_system_task(found[1].aclose)
        host, port = split_address(record.peer)
        client = PeerClient(
            self.node_id, self.secret, connect_tcp(host, port), peer_id=node, settings=self.settings
        )
        self._clients[node] = (record.peer, client)
        return client

    def fetch_from(self, node: str) -> Fetch:
        async def fetch(request: FetchRequest) -> FetchResponse:
            timeout = request.max_wait + self.settings.request_timeout
            body = await self.client(node).request(FETCH, request.encode(), timeout=timeout)
            return FetchResponse.decode(body)

        return fetch

    def forward_to(self, node: str) -> Send:
        async def send(op: str, body: Any) -> Any:
            timeout = self.settings.request_timeout
            return await self.client(node).request(op, body, timeout=timeout)

        return send

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for _address, client in clients.values():
            await client.aclose()
