"""A classic queue delivers a lone publish into an empty queue from the publisher's task (no
wait for its actor to be scheduled), and leaves a burst right after it to the actor."""

from __future__ import annotations

import pytest
import trio.testing

from tests.support.channel_double import RecordingChannel
from tqbroker.backends.memory import MemoryQueueStore
from tqbroker.broker import classic
from tqbroker.broker.arguments import QueueArguments
from tqbroker.broker.classic import ClassicQueue
from tqbroker.broker.consumer import Consumer
from tqbroker.broker.deadletter import Reason
from tqbroker.broker.queue import Queue
from tqbroker.model import Message
from tqbroker.protocol.methods import BasicProperties


class Host:
    def dead_letter(self, queue: Queue, message: Message, reason: Reason) -> None:
        pass

    def queue_unused(self, queue: Queue) -> None:
        pass


def _message(body: bytes) -> Message:
    properties = BasicProperties()
    return Message("", "q", properties.encode(), body, properties, 0)


async def test_lone_publish_delivered_at_once_burst_by_the_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = ClassicQueue(
        "/",
        "q",
        MemoryQueueStore(),
        host=Host(),
        backend_name="memory",
        durable=False,
        exclusive_owner=None,
        auto_delete=False,
        arguments=QueueArguments.parse({}),
    )
    channel = RecordingChannel()
    consumer = Consumer(
        "c", queue, channel, no_ack=False, exclusive=False, prefetch_count=10, arguments={}
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.run)
        queue.add_consumer(consumer)
        await trio.testing.wait_all_tasks_blocked()  # the actor took its wake-up
        monkeypatch.setattr(classic, "DIRECT_DISPATCH_GAP_NS", 0)  # idle: no timing in the test
        queue.publish(_message(b"one"))
        assert channel.bodies == [b"one"]  # no checkpoint in between: delivered by publish
        monkeypatch.setattr(classic, "DIRECT_DISPATCH_GAP_NS", 10**12)  # busy
        queue.publish(_message(b"two"))
        queue.publish(_message(b"three"))
        assert channel.bodies == [b"one"]  # within the gap: the actor's next pass
        await trio.testing.wait_all_tasks_blocked()
        assert channel.bodies == [b"one", b"two", b"three"]
        nursery.cancel_scope.cancel()
