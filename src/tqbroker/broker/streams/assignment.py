"""Which member of a consumer group reads each partition: sticky and balanced, over members and
partitions of any kind (sans-IO). One node's groups (``groups.py``: members are channels) and a
cluster's controller (``tqbroker.cluster.groups``: members are ids across the nodes) both
assign with ``balanced_assignment``.

- balanced: with every member on every partition, members' counts differ by at most one;
- sticky: current owners keep up to their fair share, so a rebalance moves as few partitions
  as it can;
- a partition goes only to a member that consumes it; partitions with the fewest members to
  choose from are placed first (a member on only some partitions then gets one of those
  rather than nothing); the rest go to the least loaded member there, the earliest to join
  among equals.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

Member = TypeVar("Member")  # hashable: a channel, a member's id
Part = TypeVar("Part")  # hashable: a stream queue, a queue's name


def natural_order(name: str) -> list[int | str]:
    """``orders-2`` before ``orders-10``."""
    return [int(piece) if piece.isdigit() else piece for piece in re.split(r"([0-9]+)", name)]


def balanced_assignment(
    subscribers: Mapping[Part, Sequence[Member]],
    owners: Mapping[Part, Member],
    members: Sequence[Member],
    name: Callable[[Part], str],
) -> dict[Part, Member]:
    """Each partition's reader (see the module doc). ``subscribers``: each partition's
    members, ``owners``: who reads each now, ``members``: every member in join order,
    ``name``: a partition's name (ties go in its natural order)."""
    partitions = sorted(
        (p for p in subscribers if subscribers[p]),
        key=lambda p: (len(set(subscribers[p])), natural_order(name(p))),
    )
    if not partitions:
        return {}
    floor, extra = divmod(len(partitions), len(members))
    load: Counter[Member] = Counter()
    target: dict[Part, Member] = {}
    for limit in (floor, floor + 1):  # current owners keep up to their fair share
        for partition in partitions:
            owner = owners.get(partition)
            if partition in target or owner is None or owner not in subscribers[partition]:
                continue
            if load[owner] < limit and (
                limit == floor or sum(n > floor for n in load.values()) < extra
            ):
                target[partition] = owner
                load[owner] += 1
    order = {member: i for i, member in enumerate(members)}
    for partition in partitions:
        if partition not in target:
            chosen = min(subscribers[partition], key=lambda m: (load[m], order[m]))
            target[partition] = chosen
            load[chosen] += 1
    return target
