"""Whose turn it is: the consumers of a classic queue in the order its messages go to them
(``ConsumerRing``); the next one costs O(log g) however many there are (g: the groups below, at
most one per channel and ``x-priority``), amortised over the consumers it passes over.

The order is RabbitMQ's (``rabbit_queue_consumers``): the highest ``x-priority`` first, round
robin among equals, consumers that cannot take a message passed over. Here:

- every consumer holds a turn, a number from one counter, given when it registers, when it is
  served (it goes to the back) and when it gets prefetch credit back after it was passed over
  for want of it (to the back, as RabbitMQ does); the next consumer is the one of the highest
  priority holding the lowest turn;
- consumers wait in groups, one per (channel, priority), each in turn order; a heap over the
  groups' first consumers gives the next one;
- a consumer whose own prefetch is used up (``Consumer.prefetch_full``) is parked when its turn
  comes, until ``credit_returned`` (an ack, reject or requeue of one of its messages);
- a group whose channel takes nothing now (``DeliveryChannel.credit`` 0: its socket is backed up
  or its shared prefetch, ``basic.qos`` global, is used up) leaves the heap whole when its turn
  comes, until ``channel_ready``: a channel of 100k consumers blocks and unblocks in constant
  time. Its consumers keep their turns (RabbitMQ sends each one it met blocked to the back; on
  one channel the order is the same).

Checks are lazy: ``next`` looks only at the consumer whose turn it is, so a change nobody
reported costs one look. What must be reported is the way back: the queue calls
``credit_returned`` and ``channel_ready``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable
from itertools import count, repeat
from operator import attrgetter
from typing import Final

from .consumer import Consumer, DeliveryChannel

# The heap is rebuilt once it holds this many times more entries than there are groups (each
# change of a group's first candidate pushes an entry and leaves the old one stale).
STALE_FACTOR: Final = 2

_channel_of = attrgetter("channel")


class _Group:
    """The candidates of one channel at one priority, in turn order, and its parked consumers."""

    __slots__ = ("blocked", "channel", "listed", "listed_turn", "parked", "priority", "waiting")

    def __init__(self, channel: DeliveryChannel, priority: int) -> None:
        self.channel = channel
        self.priority = priority
        self.waiting: OrderedDict[Consumer, int] = OrderedDict()  # consumer -> its turn
        self.parked: set[Consumer] = set()  # own prefetch used up
        self.blocked = False  # its channel took nothing: out of the heap until channel_ready
        self.listed = 0  # the id of its live heap entry (0: none)
        self.listed_turn = 0  # the turn that entry holds

    def __len__(self) -> int:
        return len(self.waiting) + len(self.parked)


# A heap entry: (-priority, the turn of the group's first candidate, entry id, group). The id
# is unique: no two entries compare equal, so groups are never compared.
_Entry = tuple[int, int, int, _Group]


class ConsumerRing:
    """A classic queue's consumers in delivery order (see the module's docstring)."""

    __slots__ = ("_by_channel", "_entry_ids", "_groups", "_heap", "_turns")

    def __init__(self) -> None:
        self._groups: dict[tuple[DeliveryChannel, int], _Group] = {}
        self._by_channel: dict[DeliveryChannel, list[_Group]] = {}
        self._heap: list[_Entry] = []
        self._turns = count(1)
        self._entry_ids = count(1)

    def __len__(self) -> int:
        return sum(len(group) for group in self._groups.values())

    # -- picking -----------------------------------------------------------------------------

    def next(self) -> Consumer | None:
        """The consumer the next message goes to (None: no consumer can take one now). It keeps
        its place until ``served``."""
        heap = self._heap
        while heap:
            _, _, entry, group = heap[0]
            if group.listed != entry:  # stale: the group's first candidate changed since
                heapq.heappop(heap)
                continue
            if group.channel.credit() <= 0:
                heapq.heappop(heap)
                group.listed = 0
                group.blocked = True
                continue
            consumer = next(iter(group.waiting))
            if consumer.prefetch_full():
                del group.waiting[consumer]
                group.parked.add(consumer)
                self._relist(group)
                continue
            return consumer
        return None

    def served(self, consumer: Consumer) -> None:
        """``consumer``, just answered by ``next``, took a message: to the back of its priority
        (still a candidate, as in RabbitMQ: if that used up its prefetch, ``next`` parks it when
        its turn comes)."""
        group = self._groups[consumer.channel, consumer.priority]
        waiting = group.waiting
        waiting.move_to_end(consumer)
        waiting[consumer] = next(self._turns)
        self._relist(group)

    # -- the way back ------------------------------------------------------------------------

    def credit_returned(self, consumer: Consumer) -> None:
        """One of ``consumer``'s messages was settled: parked, it is a candidate again, at the
        back of its priority."""
        group = self._groups.get((consumer.channel, consumer.priority))
        if group is None or consumer not in group.parked:
            return
        group.parked.discard(consumer)
        group.waiting[consumer] = next(self._turns)
        if len(group.waiting) == 1:
            self._relist(group)

    def channel_ready(self, channel: DeliveryChannel) -> None:
        """``channel`` may take deliveries again: its blocked groups are candidates again, their
        consumers at the turns they held."""
        for group in self._by_channel.get(channel, ()):
            if group.blocked:
                group.blocked = False
                self._relist(group)

    # -- membership --------------------------------------------------------------------------

    def add(self, consumer: Consumer) -> None:
        """A new consumer: a candidate at the back of its priority."""
        channel, priority = consumer.channel, consumer.priority
        group = self._groups.get((channel, priority))
        if group is None:
            group = self._groups[channel, priority] = _Group(channel, priority)
            self._by_channel.setdefault(channel, []).append(group)
        group.waiting[consumer] = next(self._turns)
        if len(group.waiting) == 1:
            self._relist(group)

    def remove_all(self, gone: Collection[Consumer]) -> None:
        """Drop ``gone`` (those not here are ignored). The consumers of a closing channel leave
        at C speed, without a Python step per consumer: 100k in a few milliseconds."""
        channels = set(map(_channel_of, gone))
        for channel in channels:
            groups = self._by_channel.get(channel)
            if groups is None:
                continue
            leaving: Iterable[Consumer] = gone
            if len(channels) > 1:
                leaving = [consumer for consumer in gone if consumer.channel is channel]
            for group in groups:
                deque(map(group.waiting.pop, leaving, repeat(None)), maxlen=0)
                deque(map(group.parked.discard, leaving), maxlen=0)
                self._relist(group)
            kept = [group for group in groups if len(group)]
            for group in groups:
                if not len(group):
                    del self._groups[channel, group.priority]
            if kept:
                self._by_channel[channel] = kept
            else:
                del self._by_channel[channel]

    def clear(self) -> None:
        self._groups.clear()
        self._by_channel.clear()
        self._heap.clear()

    # -- the heap ----------------------------------------------------------------------------

    def _relist(self, group: _Group) -> None:
        """Give the heap ``group``'s first candidate, after it changed (or none: empty or
        blocked). The entry at the top is replaced in place when it is the group's."""
        heap = self._heap
        top_is_ours = bool(heap) and heap[0][3] is group and heap[0][2] == group.listed
        if group.blocked or not group.waiting:
            group.listed = 0
            if top_is_ours:
                heapq.heappop(heap)
            return
        turn = next(iter(group.waiting.values()))
        if group.listed and group.listed_turn == turn:
            return  # its live entry says so already
        entry = group.listed = next(self._entry_ids)
        group.listed_turn = turn
        item = (-group.priority, turn, entry, group)
        if top_is_ours:
            heapq.heapreplace(heap, item)
            return
        heapq.heappush(heap, item)
        if len(heap) > STALE_FACTOR * len(self._groups) + 16:
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop the stale entries: one live entry per listed group."""
        self._heap = heap = []
        for group in self._groups.values():
            if group.listed:
                entry = group.listed = next(self._entry_ids)
                heap.append((-group.priority, group.listed_turn, entry, group))
        heapq.heapify(heap)
