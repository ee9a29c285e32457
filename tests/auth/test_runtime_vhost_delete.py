"""A vhost deleted at runtime, in the broker itself: a channel still open on it (its connection
is closing) cannot declare a queue there any more, and its name is free for a new vhost."""

from __future__ import annotations

import pytest

from tqbroker.protocol.errors import AMQPError, ReplyCode
from tqbroker.testing import RunningBroker


async def test_a_deleted_vhost_takes_no_new_queue(tqbroker_broker: RunningBroker) -> None:
    broker = tqbroker_broker.broker
    assert broker is not None
    vhost = broker.add_vhost("short-lived")
    vhost.declare_queue(
        "before",
        passive=False,
        durable=False,
        exclusive=False,
        auto_delete=False,
        arguments={},
        owner=None,
    )
    assert await broker.delete_vhost("short-lived")
    assert "short-lived" not in broker.vhosts
    assert vhost.queues == {}
    with pytest.raises(AMQPError) as refused:
        vhost.declare_queue(
            "after",
            passive=False,
            durable=False,
            exclusive=False,
            auto_delete=False,
            arguments={},
            owner=None,
        )
    assert refused.value.code == ReplyCode.PRECONDITION_FAILED
    assert not await broker.delete_vhost("short-lived")
    assert broker.add_vhost("short-lived").queues == {}
