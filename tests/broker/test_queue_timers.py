"""Queue timers read Trio's clock, so tests drive them with MockClock and run instantly."""

from __future__ import annotations

import pytest
import trio

from tqbroker.backends.memory import MemoryQueueStore
from tqbroker.broker.queue import ClassicQueue


def make_queue(arguments: dict[str, object]) -> tuple[ClassicQueue, list[float]]:
    queue = ClassicQueue(
        "/",
        "q",
        MemoryQueueStore(),
        durable=False,
        exclusive_owner=None,
        auto_delete=False,
        arguments=arguments,  # type: ignore[arg-type]
    )
    expired: list[float] = []
    queue.on_unused = lambda _q: expired.append(trio.current_time())
    return queue, expired


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
