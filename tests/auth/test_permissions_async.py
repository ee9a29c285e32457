"""Permission checks the channel's cache cannot answer go to the auth backend, which may take
its time (a remote service): the connection's reader awaits each such check before it reads
the next frame, so publishes keep their order and a refusal stops the channel exactly there."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pika
import pika.exceptions
import pytest
import trio

from tqbroker.auth import (
    AuthChain,
    AuthUser,
    InternalBackend,
    Peer,
    PermissionKind,
    ResourceKind,
    TopicPermission,
)
from tqbroker.testing import RunningBroker, running_broker


class SlowBackend:
    """The internal database, answering each authorization check after a pause."""

    def __init__(self, inner: InternalBackend) -> None:
        self.inner = inner
        self.checks = 0

    @property
    def generation(self) -> int:
        return self.inner.generation

    async def authenticate(
        self, username: str, password: str | None, peer: Peer
    ) -> AuthUser | None:
        return await self.inner.authenticate(username, password, peer)

    async def check_vhost(self, user: AuthUser, vhost: str, peer: Peer) -> bool:
        return await self.inner.check_vhost(user, vhost, peer)

    async def check_resource(
        self, user: AuthUser, vhost: str, kind: ResourceKind, name: str, permission: PermissionKind
    ) -> bool:
        self.checks += 1
        await trio.sleep(0.001)
        return await self.inner.check_resource(user, vhost, kind, name, permission)

    async def check_topic(
        self,
        user: AuthUser,
        vhost: str,
        exchange: str,
        routing_key: str,
        permission: PermissionKind,
        variables: Mapping[str, str],
    ) -> bool:
        self.checks += 1
        await trio.sleep(0.001)
        return await self.inner.check_topic(
            user, vhost, exchange, routing_key, permission, variables
        )


@pytest.fixture
def slow() -> Iterator[tuple[RunningBroker, SlowBackend]]:
    with running_broker() as running:
        broker = running.broker
        assert broker is not None
        backend = SlowBackend(InternalBackend(broker.users))
        broker.authenticator.chain = AuthChain([("internal", backend)])
        yield running, backend


def test_slow_checks_keep_publish_order_and_stop_at_a_refusal(
    slow: tuple[RunningBroker, SlowBackend],
) -> None:
    running, backend = slow
    assert running.broker is not None
    connection = pika.BlockingConnection(pika.URLParameters(running.url))
    try:
        channel = connection.channel()
        channel.exchange_declare("tx", "topic")
        channel.queue_declare("tq")
        channel.queue_bind("tq", "tx", "#")
        before = backend.checks
        keys = [f"k{n}" for n in range(150)]  # more keys than a channel caches: each asks
        for n, key in enumerate(keys):
            channel.basic_publish("tx", key, str(n).encode())  # pipelined: no confirms
        channel.basic_qos(prefetch_count=0)  # a round trip after the publishes
        assert backend.checks - before >= len(keys)
        got = [channel.basic_get("tq", auto_ack=True)[2] for _ in keys]
        assert got == [str(n).encode() for n in range(len(keys))]
        # A topic permission refusing "x.": the publishes before it land, the channel closes
        # at it, and nothing after it is published.
        running.broker.users.set_topic_permissions("guest", "/", TopicPermission("tx", "^k", ""))
        channel = connection.channel()
        for key in ["k-first", "x.refused", "k-after"]:
            channel.basic_publish("tx", key, key.encode())
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_qos(prefetch_count=0)
        assert closed.value.reply_code == 403
        assert "access to topic 'x.refused' in exchange 'tx'" in closed.value.reply_text
        channel = connection.channel()
        assert channel.basic_get("tq", auto_ack=True)[2] == b"k-first"
        assert channel.basic_get("tq", auto_ack=True) == (None, None, None)
    finally:
        connection.close()
