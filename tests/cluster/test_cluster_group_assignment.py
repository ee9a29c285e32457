"""The cluster's consumer-group assignment (``cluster/groups.py``) on an in-process three-node
cluster (``cluster_sim``): the controller assigns the members every node writes, balanced and
sticky, one generation per change; a leader refuses a commit from a member that a later
generation no longer gives the partition, and takes every other: Kafka's generation fencing (its
``GroupCoordinator.doCommitOffsets`` answers an ``OffsetCommit`` of another generation with
``ILLEGAL_GENERATION``; here only a commit whose partition has moved since is refused, so an
unrelated rebalance costs no commit)."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster_sim import cluster, declare_stream, settled
from tqbroker.cluster.records import (
    GroupAssignment,
    GroupMembers,
    group_assignment_key,
    group_members_key,
)

PREFIX = "/tqbroker"


async def test_members_of_every_node_are_assigned_balanced_sticky_and_by_generation(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as made:
        store = made.etcd.client()
        node = next(iter(made.members.values())).node
        parts = tuple(f"orders-{n}" for n in range(6))

        def assignment() -> GroupAssignment | None:
            found = node.view.group_assignments.get(("/", "g"))
            return found[0] if found is not None else None

        async def members(name: str, *entries: tuple[str, tuple[str, ...]]) -> None:
            key = group_members_key(PREFIX, "/", "g", name)
            if entries:
                await store.put(key, GroupMembers(entries).encode())
            else:
                await store.delete(key)

        await members("n0", ("n0/a/1", parts))
        await settled(made, lambda: (a := assignment()) is not None and len(a.owners) == 6)
        first = assignment()
        assert first is not None
        assert set(first.owners.values()) == {"n0/a/1"}

        await members("n1", ("n1/b/1", parts), ("n1/b/2", parts))
        await settled(made, lambda: (a := assignment()) is not None and a.generation > 1)
        second = assignment()
        assert second is not None
        loads = sorted(list(second.owners.values()).count(m) for m in set(second.owners.values()))
        assert loads == [2, 2, 2]
        # Sticky: the first member kept two of its own.
        assert sum(second.owners[p] == "n0/a/1" for p in parts) == 2

        await members("n1", ("n1/b/2", parts))  # one leaves: only its partitions move
        await settled(
            made,
            lambda: (a := assignment()) is not None and "n1/b/1" not in a.owners.values(),
        )
        third = assignment()
        assert third is not None
        assert third.generation == second.generation + 1
        kept = {p for p, m in second.owners.items() if m != "n1/b/1"}
        assert all(third.owners[p] == second.owners[p] for p in kept)
        assert sorted(list(third.owners.values()).count(m) for m in ("n0/a/1", "n1/b/2")) == [3, 3]

        await members("n1", ("n1/b/2", parts))  # the same again: no new generation for it
        await members("n2", ("n2/c/1", parts[:1]))  # on one partition only: gets it
        await settled(
            made, lambda: (a := assignment()) is not None and a.owners["orders-0"] == "n2/c/1"
        )
        fourth = assignment()
        assert fourth is not None
        assert fourth.generation == third.generation + 1


async def test_a_leader_refuses_a_commit_fenced_by_a_stale_generation(tmp_path: Path) -> None:
    async with cluster(tmp_path) as made:
        await declare_stream(made)
        await settled(made, lambda: made.leader() is not None)
        leader = made.leader()
        assert leader is not None
        node = made.members[leader.node_id].node
        partition = leader.partition
        store = made.etcd.client()
        key = group_assignment_key(PREFIX, "/", "g")
        await store.put(key, GroupAssignment(2, {"s": "n2/x/7"}).encode())
        await settled(made, lambda: ("/", "g") in node.view.group_assignments)

        async def commit(offset: int, member: str, generation: int) -> None:
            body = {
                "partition": "%2F/s",
                "group": {"g": offset},
                "fences": {"g": [member, generation]},
            }
            await node.take_offsets("n1", body)

        await commit(10, "n2/x/7", 2)  # the owner: taken
        assert partition.group_offsets["g"] == 10
        await commit(20, "n1/y/3", 1)  # revoked in generation 2: refused
        assert partition.group_offsets["g"] == 10
        await commit(30, "n1/y/3", 3)  # the leader has not seen generation 3 yet: taken
        assert partition.group_offsets["g"] == 30
        await node.take_offsets("n1", {"partition": "%2F/s", "group": {"g": 40}})
        assert partition.group_offsets["g"] == 40  # unfenced (one node's group): taken
