"""Consumer groups on streams, Kafka's way over AMQP 0-9-1.

A member of group ``G`` is a channel that consumes one or more stream queues (the partitions of
a partitioned stream, usually all of them) with the consumer argument ``x-stream-group: G``.
Every partition is read by exactly one member at a time; the others' consumers on it wait.

Responsibilities:
- ``ConsumerGroup``: the members' consumers on each partition, and the assignment: each
  partition to one member, balanced (with every member on every partition, members' counts
  differ by at most one) and sticky (a rebalance moves as few partitions as it can);
- rebalancing after consumers join or leave: the queue of each partition whose owner changed
  is told its new reader (``StreamQueue.assign``); a member that loses a partition while still
  there has its consumer on it cancelled (``basic.cancel``, as Kafka revokes a partition; a
  client that wants to stand by for it again consumes it again);
- ``ConsumerGroups``: a vhost's groups by name, and the task that rebalances them. A rebalance
  waits until joins and leaves pause for ``REBALANCE_DELAY`` seconds (``MAX_REBALANCE_DELAY`` at
  most): a client that cancels its consumers on six partitions one after another (pika does,
  on close) leaves once, not six times — each step of that would move partitions for nothing,
  even onto the member that is leaving.

What a group has read is kept by each partition (``StreamQueue``): its committed offset, which
moves with the owner's acks and is stored durably with the stream.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from ..consumer import Consumer, DeliveryChannel

if TYPE_CHECKING:
    from .queue import StreamQueue

REBALANCE_DELAY = 0.2
MAX_REBALANCE_DELAY = 2.0


def natural_key(queue: StreamQueue) -> list[int | str]:
    """``orders-2`` before ``orders-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"([0-9]+)", queue.name)]


class ConsumerGroup:
    def __init__(self, name: str) -> None:
        self.name = name
        # Each partition's consumers of this group, in the order they came.
        self.subscriptions: dict[StreamQueue, list[Consumer]] = {}
        self.owners: dict[StreamQueue, Consumer] = {}
        self._members: dict[DeliveryChannel, int] = {}  # consumers per member, in join order

    @property
    def members(self) -> list[DeliveryChannel]:
        return list(self._members)

    def join(self, queue: StreamQueue, consumer: Consumer) -> None:
        """Add a consumer (``rebalance()`` gives it partitions)."""
        self.subscriptions.setdefault(queue, []).append(consumer)
        self._members[consumer.channel] = self._members.get(consumer.channel, 0) + 1

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
        if self.owners.get(queue) is consumer:
            del self.owners[queue]
            queue.assign(self.name, None)  # nobody reads it until the rebalance

    @property
    def empty(self) -> bool:
        return not self.subscriptions

    def rebalance(self) -> None:
        """Give each partition a reader (see the module doc), telling queues what changed."""
        target = self._assignment()
        revoked: list[tuple[StreamQueue, Consumer]] = []
        for queue, owner in list(self.owners.items()):
            if target.get(queue) is owner:
                continue
            del self.owners[queue]
            if queue not in target:  # nobody of the group consumes it any more
                queue.assign(self.name, None)
            elif owner in self.subscriptions[queue]:
                revoked.append((queue, owner))
        for queue, owner in revoked:  # still there: told it lost the partition (and leaves)
            queue.revoke(owner)
        for queue, owner in target.items():
            if self.owners.get(queue) is not owner:
                self.owners[queue] = owner
                queue.assign(self.name, owner)

    def _assignment(self) -> dict[StreamQueue, Consumer]:
        """Which consumer reads each partition: sticky and balanced (see the module doc)."""
        # Partitions with the fewest members to choose from first: a member on only some
        # partitions then gets one of those rather than nothing.
        partitions = sorted(
            self.subscriptions,
            key=lambda q: (len({c.channel for c in self.subscriptions[q]}), natural_key(q)),
        )
        if not partitions:
            return {}
        floor, extra = divmod(len(partitions), len(self._members))
        load: Counter[DeliveryChannel] = Counter()
        target: dict[StreamQueue, Consumer] = {}
        # Current owners keep up to their fair share, then `extra` of them one more.
        for limit in (floor, floor + 1):
            for queue in partitions:
                owner = self.owners.get(queue)
                if queue in target or owner is None or owner not in self.subscriptions[queue]:
                    continue
                if load[owner.channel] < limit and (
                    limit == floor or sum(n > floor for n in load.values()) < extra
                ):
                    target[queue] = owner
                    load[owner.channel] += 1
        # The rest go to the least loaded member there (the earliest to join among equals).
        order = {member: i for i, member in enumerate(self._members)}
        for queue in partitions:
            if queue not in target:
                consumer = min(
                    self.subscriptions[queue], key=lambda c: (load[c.channel], order[c.channel])
                )
                target[queue] = consumer
                load[consumer.channel] += 1
        return target


class ConsumerGroups:
    """A vhost's consumer groups, created by their first consumer, gone with their last.
    Rebalances run in a task ``spawn`` starts (without one, right away: for tests)."""

    def __init__(self, spawn: Callable[[Callable[[], Awaitable[Any]]], None] | None = None) -> None:
        self.groups: dict[str, ConsumerGroup] = {}
        self._spawn = spawn
        self._started = False
        self._pending: set[ConsumerGroup] = set()
        self._rebalancing = False
        self._wakeup = trio.Event()

    def join(self, name: str, queue: StreamQueue, consumer: Consumer) -> None:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = ConsumerGroup(name)
        group.join(queue, consumer)
        self._schedule(group)

    def leave(self, name: str, queue: StreamQueue, consumer: Consumer) -> None:
        group = self.groups.get(name)
        if group is not None:
            group.leave(queue, consumer)
            if group.empty:
                del self.groups[name]
                self._pending.discard(group)
            else:
                self._schedule(group)

    def _schedule(self, group: ConsumerGroup) -> None:
        self._pending.add(group)
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
                self._pending.pop().rebalance()
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
