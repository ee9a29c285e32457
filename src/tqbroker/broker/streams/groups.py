"""Consumer groups on streams, Kafka's way over AMQP 0-9-1.

A member of group ``G`` is a channel that consumes one or more stream queues (the partitions of
a partitioned stream, usually all of them) with the consumer argument ``x-stream-group: G``.
Every partition is read by exactly one member at a time; the others' consumers on it wait.

Responsibilities:
- ``ConsumerGroup``: the members' consumers on each partition, and the assignment: each
  partition to one member, balanced and sticky (``assignment.py``);
- rebalancing after consumers join or leave: the queue of each partition whose owner changed
  is told its new reader (``StreamQueue.assign``); a member that loses a partition while still
  there has its consumer on it cancelled (``basic.cancel``, as Kafka revokes a partition; a
  client that wants to stand by for it again consumes it again);
- in a cluster, the assignment is made across the nodes (``GroupCoordination``, the cluster's
  ``tqbroker.cluster.groups``): a node tells it when its members change and applies the
  assignments it gets (``ConsumerGroups.apply_assignment``: members by id, each assignment a
  generation that fences the commits of members it revoked);
- ``ConsumerGroups``: a vhost's groups by name, and the task that rebalances them. A rebalance
  waits until joins and leaves pause for ``REBALANCE_DELAY`` seconds (``MAX_REBALANCE_DELAY`` at
  most): a client that cancels its consumers on six partitions one after another (pika does,
  on close) leaves once, not six times — each step of that would move partitions for nothing,
  even onto the member that is leaving.

What a group has read is kept by each partition (``StreamQueue``): its committed offset, which
moves with the owner's acks and is stored durably with the stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..consumer import Consumer, DeliveryChannel
from .assignment import balanced_assignment, natural_order
from .partition import GroupFence

if TYPE_CHECKING:
    from .queue import StreamQueue

REBALANCE_DELAY = 0.2
MAX_REBALANCE_DELAY = 2.0


def natural_key(queue: StreamQueue) -> list[int | str]:
    """``orders-2`` before ``orders-10``."""
    return natural_order(queue.name)


class GroupCoordination(Protocol):
    """A cluster's assignment of every node's members (``tqbroker.cluster.groups``)."""

    member_prefix: str  # what makes this node's member ids unique in the cluster

    def members_changed(self, vhost: str, group: ConsumerGroup) -> None:
        """``group``'s members here changed (it may be empty now): the cluster assigns again,
        and calls ``ConsumerGroups.apply_assignment`` with what it decides."""
        ...


class ConsumerGroup:
    def __init__(self, name: str) -> None:
        self.name = name
        # Each partition's consumers of this group, in the order they came.
        self.subscriptions: dict[StreamQueue, list[Consumer]] = {}
        self.owners: dict[StreamQueue, Consumer] = {}
        self._members: dict[DeliveryChannel, int] = {}  # consumers per member, in join order
        self._ids: dict[DeliveryChannel, str] = {}  # each member's id (a cluster's assignment)
        self.generation = 0  # the cluster's assignment applied (0: assigned here alone)

    @property
    def members(self) -> list[DeliveryChannel]:
        return list(self._members)

    def member_id(self, channel: DeliveryChannel) -> str:
        return self._ids[channel]

    @property
    def member_ids(self) -> set[str]:
        return set(self._ids.values())

    def member_partitions(self) -> list[tuple[str, list[str]]]:
        """Each member's id and the partitions it consumes, in join order."""
        return [
            (self._ids[member], [q.name for q, cs in self._subscribed() if member in cs])
            for member in self._members
        ]

    def _subscribed(self) -> list[tuple[StreamQueue, set[DeliveryChannel]]]:
        return [(q, {c.channel for c in cs}) for q, cs in self.subscriptions.items()]

    def join(self, queue: StreamQueue, consumer: Consumer, member_id: str = "") -> None:
        """Add a consumer (``rebalance()`` gives it partitions); a new member takes
        ``member_id``."""
        self.subscriptions.setdefault(queue, []).append(consumer)
        self._members[consumer.channel] = self._members.get(consumer.channel, 0) + 1
        self._ids.setdefault(consumer.channel, member_id)

    def leave(self, queue: StreamQueue, consumer: Consumer) -> None:
        """Remove a consumer (``rebalance()`` gives its partition to another)."""
        consumers = self.subscriptions.get(queue)
        if consumers is None or consumer not in consumers:
            return
        consumers.remove(consumer)
        if not consumers:
            del self.subscriptions[queue]
        remaining = self._members[consumer.channel] - 1
        if remaining:
            self._members[consumer.channel] = remaining
        else:
            del self._members[consumer.channel]
            del self._ids[consumer.channel]
        if self.owners.get(queue) is consumer:
            del self.owners[queue]
            queue.assign(self.name, None)  # nobody reads it until the rebalance

    @property
    def empty(self) -> bool:
        return not self.subscriptions

    def rebalance(self) -> None:
        """Give each partition a reader (see the module doc), telling queues what changed."""
        self.apply(self._assignment())

    def apply_owners(self, owners: Mapping[str, str], generation: int) -> None:
        """A cluster's assignment (each partition's member id, by queue name): the partitions
        it gives members here are theirs, the others are nobody's here."""
        channels = {member_id: channel for channel, member_id in self._ids.items()}
        target: dict[StreamQueue, Consumer] = {}
        for queue in self.subscriptions:
            channel = channels.get(owners.get(queue.name, ""))
            if channel is not None:
                target[queue] = self._consumer_of(queue, channel)
        self.generation = generation
        self.apply(target)

    def apply(self, target: Mapping[StreamQueue, Consumer]) -> None:
        """Make ``target`` the readers: partitions that changed hands are revoked from their
        owner (cancelled, if it still consumes them) and assigned to the new one."""
        revoked: list[tuple[StreamQueue, Consumer]] = []
        for queue, owner in list(self.owners.items()):
            if target.get(queue) is owner:
                continue
            del self.owners[queue]
            if queue not in target:  # nobody here reads it (now)
                queue.assign(self.name, None)
            if owner in self.subscriptions.get(queue, ()):
                revoked.append((queue, owner))
        for queue, owner in revoked:  # still there: told it lost the partition (and leaves)
            queue.revoke(owner)
        for queue, owner in target.items():
            if self.owners.get(queue) is not owner:
                self.owners[queue] = owner
                queue.assign(self.name, owner, self._fence(owner))

    def _fence(self, owner: Consumer) -> GroupFence | None:
        if not self.generation:
            return None
        return GroupFence(self._ids[owner.channel], self.generation)

    def _assignment(self) -> dict[StreamQueue, Consumer]:
        """Which consumer reads each partition (``balanced_assignment`` over the members)."""
        chosen = balanced_assignment(
            {q: list(dict.fromkeys(c.channel for c in cs)) for q, cs in self.subscriptions.items()},
            {q: c.channel for q, c in self.owners.items()},
            list(self._members),
            lambda queue: queue.name,
        )
        return {queue: self._consumer_of(queue, channel) for queue, channel in chosen.items()}

    def _consumer_of(self, queue: StreamQueue, channel: DeliveryChannel) -> Consumer:
        """The member's consumer that reads ``queue``: the owner's if it is the member's."""
        owner = self.owners.get(queue)
        if owner is not None and owner.channel is channel:
            return owner
        return next(c for c in self.subscriptions[queue] if c.channel is channel)


class ConsumerGroups:
    """A vhost's consumer groups, created by their first consumer, gone with their last.
    Rebalances run in a task ``spawn`` starts (without one, right away: for tests); in a
    cluster (``coordination``), they are the cluster's."""

    def __init__(
        self,
        spawn: Callable[[Callable[[], Awaitable[Any]]], None] | None = None,
        vhost: str = "/",
    ) -> None:
        self.groups: dict[str, ConsumerGroup] = {}
        self.vhost = vhost
        self.coordination: GroupCoordination | None = None
        self._spawn = spawn
        self._started = False
        self._pending: dict[str, ConsumerGroup] = {}
        self._rebalancing = False
        self._wakeup = trio.Event()
        self._members_joined = 0  # members' ids: a count
        # A cluster's latest assignment of each group: partition (queue name) -> member id.
        self.assignments: dict[str, Mapping[str, str]] = {}

    def join(self, name: str, queue: StreamQueue, consumer: Consumer) -> None:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = ConsumerGroup(name)
        self._members_joined += 1
        prefix = self.coordination.member_prefix if self.coordination is not None else ""
        group.join(queue, consumer, f"{prefix}{self._members_joined}")
        self._schedule(group)

    def leave(self, name: str, queue: StreamQueue, consumer: Consumer) -> None:
        group = self.groups.get(name)
        if group is not None:
            group.leave(queue, consumer)
            if group.empty:
                del self.groups[name]
                if self.coordination is None:
                    self._pending.pop(name, None)
                    return
            self._schedule(group)

    def apply_assignment(self, name: str, owners: Mapping[str, str], generation: int) -> None:
        """The cluster's assignment of group ``name`` (see ``ConsumerGroup.apply_owners``)."""
        self.assignments[name] = owners
        group = self.groups.get(name)
        if group is not None and generation >= group.generation:
            group.apply_owners(owners, generation)

    def read_elsewhere(self, name: str, queue: StreamQueue) -> str | None:
        """The id of the member on another node that the cluster gives ``queue`` to, if any."""
        member = self.assignments.get(name, {}).get(queue.name)
        group = self.groups.get(name)
        if member is None or (group is not None and member in group.member_ids):
            return None
        return member

    def _schedule(self, group: ConsumerGroup) -> None:
        self._pending[group.name] = group
        if self._spawn is None:
            if not self._rebalancing:
                self._rebalance_pending()
            return
        self._wakeup.set()
        if not self._started:
            self._started = True
            self._spawn(self.run)

    def _rebalance_pending(self) -> None:
        """Rebalance what is pending (a rebalance's revocations make their group pending
        again: that second pass changes nothing)."""
        self._rebalancing = True
        try:
            while self._pending:
                _name, group = self._pending.popitem()
                if self.coordination is not None:
                    self.coordination.members_changed(self.vhost, group)
                else:
                    group.rebalance()
        finally:
            self._rebalancing = False

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            with trio.move_on_after(MAX_REBALANCE_DELAY):
                while True:  # until joins and leaves pause
                    self._wakeup = trio.Event()
                    with trio.move_on_after(REBALANCE_DELAY) as quiet:
                        await self._wakeup.wait()
                    if quiet.cancelled_caught:
                        break
            self._wakeup = trio.Event()
            self._rebalance_pending()
