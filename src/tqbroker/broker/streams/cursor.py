"""Where a consumer group is on one partition (``GroupCursor``): the reader the partition is
assigned to, the next offset to deliver, and what was delivered and is not settled yet; the
group's committed offset is the first unsettled delivery (a settled prefix, never past an
unacked delivery). Kept by the partition's ``StreamQueue``."""

from __future__ import annotations

from collections import deque

import attrs

from ..consumer import Consumer
from .partition import GroupFence


@attrs.define
class GroupCursor:
    """Where a consumer group is on one partition: who reads it, the next offset to deliver,
    and what was delivered to that reader and is not settled yet."""

    owner: Consumer
    position: int
    fence: GroupFence | None = None  # what its commits carry in a cluster
    delivered: deque[int] = attrs.field(factory=deque)  # in offset order, settled ones too
    unsettled: set[int] = attrs.field(factory=set)

    def note(self, offset: int) -> None:
        """``offset`` was delivered to the reader."""
        self.delivered.append(offset)
        self.unsettled.add(offset)

    def settle(self, offset: int) -> None:
        """The reader acked (or rejected without requeue) ``offset``."""
        self.unsettled.discard(offset)
        delivered = self.delivered
        while delivered and delivered[0] not in self.unsettled:
            delivered.popleft()

    def rewind(self, offset: int) -> None:
        """The reader gave ``offset`` back (requeue): deliver it and what follows again. Acks
        still to come for those deliveries settle the new ones (they were processed)."""
        delivered = self.delivered
        while delivered and delivered[-1] >= offset:
            self.unsettled.discard(delivered.pop())
        self.position = min(self.position, offset)

    @property
    def committed(self) -> int:
        """The first unsettled delivery, or the next offset to deliver."""
        return self.delivered[0] if self.delivered else self.position
