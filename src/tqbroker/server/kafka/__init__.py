"""The Kafka listener: Kafka clients on the broker's streams (``connection.py``: the
requests of one connection; ``handlers.py``: what each API answers; ``groups.py``: consumer
groups; ``session.py``: who a connection is). The codec is sans-IO, in
``tqbroker.protocol.kafka``."""

from __future__ import annotations

import logging

import trio

from ...broker.broker import Broker
from ...cluster.node import ClusterNode
from .connection import KafkaConnection
from .groups import GroupCoordinator
from .nodes import KafkaNodes

log = logging.getLogger(__name__)


class KafkaService:
    """The node's Kafka side: its group coordinator (``run``) and its connections
    (``handle``)."""

    def __init__(self, broker: Broker, cluster: ClusterNode | None = None) -> None:
        self.broker = broker
        self.groups = GroupCoordinator()
        self.nodes = KafkaNodes(cluster)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self.groups.run()

    async def handle(
        self,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        certificate_username: str | None = None,
    ) -> None:
        """Serve one Kafka connection (over TLS: after its handshake, with the user its
        verified client certificate names) until it ends; a bug in it costs it alone."""
        connection = KafkaConnection(
            self.broker, self.groups, stream, certificate_username, self.nodes
        )
        try:
            await connection.run()
        except* Exception as group:
            log.error("kafka connection %s failed", connection.peer, exc_info=group)
            await trio.aclose_forcefully(stream)
