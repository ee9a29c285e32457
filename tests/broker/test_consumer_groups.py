"""The consumer-group assignment (``broker/streams/groups.py``) as a state machine: members come
and go on a stream's partitions; after every step each partition someone consumes has exactly one
reader among its consumers, loads are balanced when everyone is on every partition, and a
partition only moves when it must (sticky)."""

from __future__ import annotations

from collections import Counter
from typing import cast

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tqbroker.broker.consumer import Consumer, DeliveryChannel
from tqbroker.broker.streams.groups import ConsumerGroup

PARTITIONS = 6


class Partition:
    """What ``ConsumerGroup`` asks of a stream queue: ``assign`` and ``revoke`` (which cancels
    the consumer there, so it leaves the group as ``StreamQueue.revoke`` makes it)."""

    def __init__(self, name: str, group: ConsumerGroup, revoked: list[Consumer]) -> None:
        self.name = name
        self.group = group
        self.revoked = revoked
        self.reader: Consumer | None = None

    def assign(self, group: str, consumer: Consumer | None, fence: object = None) -> None:
        self.reader = consumer

    def revoke(self, consumer: Consumer) -> None:
        self.revoked.append(consumer)
        self.group.leave(self, consumer)  # type: ignore[arg-type]


Member = DeliveryChannel


def new_member() -> Member:
    """A channel (only its identity matters to the group)."""
    return cast(DeliveryChannel, object())


def consume(group: ConsumerGroup, member: Member, partition: Partition) -> Consumer:
    """``member`` consumes ``partition`` in ``group`` (a rebalance gives it partitions)."""
    consumer = Consumer(
        "t",
        partition,  # type: ignore[arg-type]
        member,
        no_ack=False,
        exclusive=False,
        prefetch_count=1,
        arguments={},
    )
    group.join(partition, consumer)  # type: ignore[arg-type]
    return consumer


class Assignment(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.group = ConsumerGroup("g")
        self.revoked: list[Consumer] = []
        self.partitions = [Partition(f"p-{n}", self.group, self.revoked) for n in range(PARTITIONS)]
        self.members: list[Member] = []

    def _consume(self, member: Member, partition: Partition) -> Consumer:
        return consume(self.group, member, partition)

    def _join(self, member: Member, partitions: list[Partition]) -> None:
        for partition in partitions:
            self._consume(member, partition)
        self.group.rebalance()

    @rule()
    def member_joins_every_partition(self) -> None:
        member = new_member()
        self.members.append(member)
        owners_before = dict(self.group.owners)
        self.revoked.clear()
        self._join(member, self.partitions)
        # Sticky: a join only takes partitions for the newcomer, at most its fair share.
        moved = [q for q, c in owners_before.items() if self.group.owners.get(q) is not c]
        assert all(self.group.owners[q].channel is member for q in moved)
        assert len(moved) <= -(-PARTITIONS // len(self.members))
        # Revoked members stand by again, as a client told by basic.cancel does; that moves
        # nothing.
        owners = dict(self.group.owners)
        for consumer in list(self.revoked):
            self._join(consumer.channel, [consumer.queue])  # type: ignore[list-item]
        assert self.group.owners == owners

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def member_leaves(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(self.members))
        self.members.remove(member)
        owners_before = dict(self.group.owners)
        for queue, consumers in list(self.group.subscriptions.items()):
            for consumer in [c for c in consumers if c.channel is member]:
                self.group.leave(queue, consumer)
        self.group.rebalance()
        # Only the leaver's partitions move.
        for queue, owner in owners_before.items():
            if owner.channel is not member:
                assert self.group.owners[queue] is owner

    @invariant()
    def one_reader_per_partition_among_its_consumers(self) -> None:
        for partition in self.partitions:
            consumers = self.group.subscriptions.get(partition, [])  # type: ignore[call-overload]
            if consumers:
                assert partition.reader in consumers
                assert self.group.owners[partition] is partition.reader  # type: ignore[index]
            else:
                assert partition.reader is None

    @invariant()
    def balanced(self) -> None:
        if self.members:
            load = Counter(c.channel for c in self.group.owners.values())
            counts = [load[m] for m in self.members]
            assert max(counts) - min(counts) <= 1, counts


TestAssignment = Assignment.TestCase


def test_a_member_on_some_partitions_gets_one_of_them() -> None:
    """B reads p-0 and p-1; A comes for p-0 only: A gets p-0, B keeps p-1 (not B both)."""
    group = ConsumerGroup("g")
    revoked: list[Consumer] = []
    p0, p1 = Partition("p-0", group, revoked), Partition("p-1", group, revoked)
    a, b = new_member(), new_member()

    b0, b1 = consume(group, b, p0), consume(group, b, p1)
    group.rebalance()
    assert (p0.reader, p1.reader) == (b0, b1)
    a0 = consume(group, a, p0)
    group.rebalance()
    assert (p0.reader, p1.reader) == (a0, b1)
    assert revoked == [b0]
