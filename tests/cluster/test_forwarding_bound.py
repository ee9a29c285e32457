"""A follower's queue of publishes forwarded to its leader is bounded (``cluster/forwarding.py``):
while the leader is slow to answer, publishes past ``max_queued_bytes`` of bodies are refused
(nacked) instead of held in memory; those queued before are confirmed once it answers, and new
ones are taken again once the queue drains."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from tqbroker.cluster.forwarding import Forwarder
from tqbroker.model import Message

BODY = b"x" * 1000


def messages(count: int) -> list[Message]:
    return [Message("", "s", b"", BODY) for _ in range(count)]


async def test_a_slow_leader_makes_the_forward_queue_refuse_rather_than_grow() -> None:
    answer = trio.Event()
    requests: list[int] = []

    async def slow_leader(op: str, body: Any) -> Any:  # the link: every batch waits for it
        requests.append(len(body["messages"]))
        await answer.wait()
        return {"taken": len(body["messages"]), "error": None}

    forwarder = Forwarder("%2F/s", "n0", slow_leader)
    forwarder.max_queued_bytes = 10 * len(BODY)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(forwarder.run)
        first = forwarder.forward(messages(1))  # sent at once: the leader holds it
        await trio.testing.wait_all_tasks_blocked()
        queued = forwarder.forward(messages(10))  # waits in the queue: the bound
        refused = forwarder.forward(messages(1))
        assert first is not None
        assert queued is not None
        assert refused is None
        answer.set()
        commit, ticket = queued[-1]  # type: ignore[misc]
        with trio.fail_after(5):
            assert await commit.wait(ticket)
        again = forwarder.forward(messages(1))  # drained: taken again
        assert again is not None
        commit, ticket = again[-1]  # type: ignore[misc]
        with trio.fail_after(5):
            assert await commit.wait(ticket)
        assert requests == [1, 10, 1]
        nursery.cancel_scope.cancel()
