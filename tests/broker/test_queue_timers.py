"""Queue timers read Trio's clock, so tests drive them with MockClock and run instantly."""

from __future__ import annotations

import pytest
import trio

from tqbroker.backends.memory import MemoryQueueStore
from tqbroker.broker.arguments import QueueArguments
from tqbroker.broker.classic import ClassicQueue
from tqbroker.broker.deadletter import Reason
from tqbroker.broker.queue import Queue
from tqbroker.model import Message


class Host:
    """Records when the queue asks to be deleted as unused."""

    def __init__(self) -> None:
        self.expired: list[float] = []

    def dead_letter(self, queue: Queue, message: Message, reason: Reason) -> None:
        pass

    def queue_unused(self, queue: Queue) -> None:
        self.expired.append(trio.current_time())


def make_queue(arguments: dict[str, object]) -> tuple[ClassicQueue, list[float]]:
    host = Host()
    queue = ClassicQueue(
        "/",
        "q",
        MemoryQueueStore(),
        host=host,
        backend_name="memory",
        durable=False,
        exclusive_owner=None,
        auto_delete=False,
        arguments=QueueArguments.parse(arguments),  # type: ignore[arg-type]
    )
    return queue, host.expired


async def test_x_expires_fires_after_the_unused_period(autojump_clock: trio.abc.Clock) -> None:
    """pytest-trio's ``autojump_clock``: 59 minutes of queue life pass in no time."""
    async with trio.open_nursery() as nursery:
        queue, expired = make_queue({"x-expires": 30 * 60 * 1000})  # 30 minutes
        start = trio.current_time()
        nursery.start_soon(queue.run)
        await trio.sleep(29 * 60)
        assert expired == []
        queue.touch()  # e.g. a basic.get: the countdown restarts
        await trio.sleep(29 * 60)
        assert expired == []
        await trio.sleep(2 * 60)
        assert len(expired) == 1
        assert expired[0] - start == pytest.approx(29 * 60 + 30 * 60)
