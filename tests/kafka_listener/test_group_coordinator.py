"""The group coordinator's state machine (``server/kafka/groups.py``) on Trio's mock clock:
Kafka's classic protocol as ``GroupCoordinator.scala`` runs it (KIP-394's
MEMBER_ID_REQUIRED, a generation per rebalance, the leader's assignment, REBALANCE_IN_PROGRESS
to heartbeats while one is under way and to commits once every member joined,
ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID, session expiry, static members)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from tqbroker.server.kafka.groups import (
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    MEMBER_ID_REQUIRED,
    REBALANCE_IN_PROGRESS,
    STABLE,
    UNKNOWN_MEMBER_ID,
    GroupCoordinator,
)


def join_body(member_id: str = "", instance: str | None = None, session_ms: int = 10_000) -> Any:
    return {
        "group_id": "g",
        "member_id": member_id,
        "group_instance_id": instance,
        "session_timeout_ms": session_ms,
        "rebalance_timeout_ms": 5000,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": member_id.encode() or b"m"}],
    }


async def joined(groups: GroupCoordinator, client: str, **options: Any) -> dict[str, Any]:
    first = await groups.join(join_body(**options), 5, client)
    assert first["error_code"] == MEMBER_ID_REQUIRED
    return await groups.join(join_body(member_id=first["member_id"], **options), 5, client)


async def join_both(groups: GroupCoordinator, **options: Any) -> dict[str, Any]:
    """Members "a" and "b" join at once; their join answers."""
    answers: dict[str, Any] = {}

    async def join(client: str) -> None:
        answers[client] = await joined(groups, client, **options)

    async with trio.open_nursery() as joining:
        joining.start_soon(join, "a")
        joining.start_soon(join, "b")
    return answers


async def test_two_members_one_generation_and_the_leaders_assignment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    groups = GroupCoordinator()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(groups.run)
        answers = await join_both(groups)
        a, b = answers["a"], answers["b"]
        assert a["generation_id"] == b["generation_id"] == 1
        assert a["leader"] == b["leader"]
        leader, follower = (a, b) if a["leader"] == a["member_id"] else (b, a)
        assert len(leader["members"]) == 2
        assert follower["members"] == []
        synced: dict[str, Any] = {}

        async def sync(answer: Any, assignments: list[Any]) -> None:
            synced[answer["member_id"]] = await groups.sync(
                {
                    "group_id": "g",
                    "generation_id": 1,
                    "member_id": answer["member_id"],
                    "assignments": assignments,
                }
            )

        async with trio.open_nursery() as syncing:
            syncing.start_soon(sync, follower, [])
            await trio.sleep(1)  # the follower waits for the leader's assignment
            assert not synced
            plan = [
                {"member_id": leader["member_id"], "assignment": b"L"},
                {"member_id": follower["member_id"], "assignment": b"F"},
            ]
            syncing.start_soon(sync, leader, plan)
        assert synced[follower["member_id"]]["assignment"] == b"F"
        assert synced[leader["member_id"]]["assignment"] == b"L"
        assert groups.groups["g"].state == STABLE
        nursery.cancel_scope.cancel()


async def test_a_member_that_stops_heartbeating_is_removed_and_the_group_rebalances(
    autojump_clock: trio.testing.MockClock,
) -> None:
    groups = GroupCoordinator()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(groups.run)
        answers = await join_both(groups, session_ms=3000)
        a, b = answers["a"]["member_id"], answers["b"]["member_id"]
        leader = answers["a"]["leader"]
        # Every member joined, the assignment not yet synced (CompletingRebalance): Kafka's
        # doCommitOffsets refuses a commit, the member's generation notwithstanding.
        assert groups.check_commit("g", 1, a) == REBALANCE_IN_PROGRESS
        await groups.sync(
            {"group_id": "g", "generation_id": 1, "member_id": leader, "assignments": []}
        )
        for _ in range(4):  # a heartbeats, b does not
            await trio.sleep(1)
            assert groups.heartbeat({"group_id": "g", "generation_id": 1, "member_id": a}) in (
                0,
                REBALANCE_IN_PROGRESS,
            )
        assert b not in groups.groups["g"].members
        beat = {"group_id": "g", "generation_id": 1, "member_id": a}
        assert groups.heartbeat(beat) == REBALANCE_IN_PROGRESS  # rejoin
        # PreparingRebalance: a member of the current generation commits what it processed
        # before it joins again (Kafka's doCommitOffsets: "we still allow a commit request").
        assert groups.check_commit("g", 1, a) == 0
        again = await groups.join(join_body(member_id=a, session_ms=3000), 5, "a")
        assert again["generation_id"] == 2
        assert again["leader"] == a
        assert groups.heartbeat(beat) == ILLEGAL_GENERATION
        assert groups.heartbeat({**beat, "member_id": b}) == UNKNOWN_MEMBER_ID
        assert groups.check_commit("g", 1, a) == ILLEGAL_GENERATION
        nursery.cancel_scope.cancel()


async def test_a_static_member_keeps_its_member_id(autojump_clock: trio.testing.MockClock) -> None:
    groups = GroupCoordinator()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(groups.run)
        first = await groups.join(join_body(instance="i-1"), 5, "a")
        assert first["error_code"] == 0  # a static member needs no second join
        restarted = await groups.join(join_body(instance="i-1"), 5, "a")
        assert restarted["member_id"] == first["member_id"]
        unknown = await groups.join(join_body(member_id="nobody"), 5, "c")
        assert unknown["error_code"] == UNKNOWN_MEMBER_ID
        bare = await groups.join({**join_body(), "protocols": []}, 5, "d")
        assert bare["error_code"] == INCONSISTENT_GROUP_PROTOCOL  # encodable, not a crash
        nursery.cancel_scope.cancel()
