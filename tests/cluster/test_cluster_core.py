"""Three brokers in one Trio run, each with its own data directory, one FakeEtcd between them
and direct calls for the node-to-node fetch: the controller is elected, a stream queue's
definition gets a partition record, its leader's appends are confirmed once every in-sync
replica has them, followers copy them frame for frame; when the leader's lease goes, the
controller elects another member of the ISR at the next epoch and nothing confirmed is lost."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.support.cluster_sim import Member, append, cluster, declare_stream, settled
from tests.support.polling import eventually_async
from tqbroker.broker.declaring import open_and_declare_queue
from tqbroker.model import Message


async def test_a_stream_gets_three_replicas_and_a_confirm_waits_for_all(tmp_path: Path) -> None:
    async with cluster(tmp_path) as made:
        await eventually_async(lambda: any(m.node.controller.active for m in made.members.values()))
        await declare_stream(made)
        await settled(made, lambda: made.leader() is not None)
        record = made.record()
        assert record is not None
        assert sorted(record.replicas) == ["n0", "n1", "n2"]
        assert record.min_isr == 2
        leader = made.leader()
        assert leader is not None
        await settled(made, lambda: len(leader.isr) == 3)
        assert await append(leader, [b"m%d" % n for n in range(100)])
        for member in made.members.values():
            assert member.partition().durable_end >= 100
        # A follower forwards appends to the leader: confirmed once the ISR has them.
        follower = next(m for n, m in made.members.items() if n != leader.node_id)
        _first, taken, error = follower.partition().append([Message("", "k", b"", b"x")])
        assert error is None
        commit, ticket = taken[0]  # type: ignore[misc]
        with trio.fail_after(15):
            assert await commit.wait(ticket)
        assert leader.partition.read_many(100, 10)[0].message.body == b"x"
        await settled(made, lambda: follower.partition().high_watermark == 101)
        # With its leader unreachable, a forwarded append is refused (nacked), not lost.
        made.cut.add(leader.node_id)
        _first, taken, error = follower.partition().append([Message("", "k", b"", b"y")])
        commit, ticket = taken[0]  # type: ignore[misc]
        with trio.fail_after(15):
            assert not await commit.wait(ticket)


async def test_the_leader_s_death_elects_an_isr_member_and_loses_nothing(tmp_path: Path) -> None:
    async with cluster(tmp_path) as made:
        await declare_stream(made)
        await settled(made, lambda: made.leader() is not None and len(made.leader().isr) == 3)  # type: ignore[union-attr]
        leader = made.leader()
        assert leader is not None
        assert await append(leader, [b"m%d" % n for n in range(50)])
        old, epoch = leader.node_id, leader.epoch
        made.kill(old)
        await settled(made, lambda: made.leader() is not None)
        successor = made.leader()
        assert successor is not None
        assert successor.node_id != old
        assert successor.epoch == epoch + 1
        await settled(made, lambda: successor.partition.high_watermark >= 50)
        records = successor.partition.read_many(0, 1000)
        assert [r.message.body for r in records][:50] == [b"m%d" % n for n in range(50)]
        # The remaining two go on (min ISR 2 after the dead node leaves the ISR).
        assert await append(successor, [b"after"])


def has_binding(member: Member, exchange: str, queue: str) -> bool:
    found = member.broker.vhosts["/"].exchanges.get(exchange)
    bound = [getattr(dest, "name", None) for dest, _key, _args in (found.bindings if found else ())]
    return queue in bound


async def test_definitions_reach_every_node_and_a_delete_stays_deleted(tmp_path: Path) -> None:
    """The catalog: an exchange, a stream and a binding declared on one node exist on every
    node; a delete on another node removes them everywhere, and a node that was down during
    the delete does not bring the stream back when it returns (its base says it agreed)."""
    async with cluster(tmp_path) as made:
        await declare_stream(made)
        n0 = made.members["n0"]
        vhost = n0.broker.vhosts["/"]
        vhost.declare_exchange(
            "x",
            "topic",
            passive=False,
            durable=True,
            auto_delete=False,
            internal=False,
            arguments={},
        )
        vhost.bind_queue("s", "x", "k.#", {}, None)
        members = list(made.members.values())
        await settled(made, lambda: all(has_binding(m, "x", "s") for m in members))
        # A classic queue stays on its node.
        await open_and_declare_queue(
            vhost,
            "classic",
            passive=False,
            durable=True,
            exclusive=False,
            auto_delete=False,
            arguments={},
            owner=None,
        )
        made.kill("n2")
        made.members["n1"].broker.vhosts["/"].delete_queue(
            "s", if_unused=False, if_empty=False, owner=None
        )
        await settled(made, lambda: "s" not in n0.broker.vhosts["/"].queues)
        back = await made.start("n2")
        await settled(made, lambda: "s" not in back.broker.vhosts["/"].queues)
        assert "x" in back.broker.vhosts["/"].exchanges
        assert "classic" not in back.broker.vhosts["/"].queues
        assert "classic" in n0.broker.vhosts["/"].queues
        assert not any("/queues/s" in key for key in n0.node.view.definitions)


async def test_consumers_offsets_reach_every_replica(tmp_path: Path) -> None:
    """A tracked consumer's offset stored on a follower goes to the leader, and the leader's
    offsets (tracked and group ones) reach every follower with its fetches: a consumer
    resumes from its offset on whichever node it reconnects to."""
    async with cluster(tmp_path) as made:
        await declare_stream(made)
        await settled(made, lambda: made.leader() is not None)
        leader = made.leader()
        assert leader is not None
        await settled(made, lambda: len(leader.isr) == 3)
        assert await append(leader, [b"m%d" % n for n in range(50)])
        follower, other = [m for n, m in made.members.items() if n != leader.node_id]
        follower.partition().store_offset("tracked-1", 42)
        leader.partition.commit_group_offset("group-1", 17)
        await settled(
            made,
            lambda: all(
                m.partition().tracked_offsets.get("tracked-1") == 42
                and m.partition().group_offsets.get("group-1") == 17
                for m in made.members.values()
            ),
        )
        assert other.partition().tracked_offsets["tracked-1"] == 42
