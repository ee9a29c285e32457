"""A partition's leader replica: it takes the appends, serves its followers' fetches, keeps the
in-sync replica set (ISR) and moves the high watermark (Kafka's ``Partition`` on its leader).

Responsibilities (the rules of ``shared/reference/scaleout.md`` §4.4 and ``cluster.md`` A8/A9):
- fencing: it answers fetches of its own epoch only, and begins that epoch in the log's
  history, durably, before it takes an append (``begin``);
- the high watermark: the least durable end over the ISR **as committed** (its own included),
  moving only forward and only while the ISR has at least ``min_isr`` members (KIP-966);
  a follower's progress counts only from a fetch whose log matched the leader's (no divergence);
- confirms: an append's confirm waits until the high watermark passes it (``ReplicatedCommit``,
  the ``GroupCommit`` its tickets come from): every ISR member has fsync'd it. Below
  ``min_isr`` appends are refused, and those waiting fail (nacked), as do those older than
  ``publish_timeout`` and all of them when the leader steps down;
- the ISR: a follower that has not caught up with the leader's log end for ``replica_lag``
  seconds, whose replica identity changed, or whose durable end fell below the high watermark
  (it lost data it had acknowledged) leaves it; one that reached the high watermark at this
  epoch joins it. Every change is written through the ``IsrWriter`` (a compare-and-swap in
  etcd) and used only once that write succeeded: a shrink never lets the high watermark move
  over records an excluded member may lack until it is committed, an expand counts the new
  member only after.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs
import trio

from ..broker.streams.partition import GroupFence, OffsetKind, Partition
from ..model import Message
from ..plugins.spec import Durability, FlushListener, GroupCommit
from .fetch import (
    FENCED_EPOCH,
    OUT_OF_RANGE,
    UNKNOWN_EPOCH,
    FetchRequest,
    FetchResponse,
    divergence,
    epoch_at,
)

log = logging.getLogger(__name__)


class NotLeader(OSError):
    """Appends are refused: this replica does not lead the partition (now)."""


class NotEnoughReplicas(OSError):
    """Appends are refused: the ISR is smaller than ``min_isr`` (Kafka's
    ``NOT_ENOUGH_REPLICAS``)."""


class IsrWriter(Protocol):
    """Where a leader's ISR changes are committed (the cluster's metadata store)."""

    async def write_isr(self, leader: LeaderReplica, isr: Mapping[str, str]) -> bool:
        """Commit ``isr`` (node id -> replica id) as the partition's ISR at the leader's epoch;
        False if the write was fenced (another leader, epoch or controller moved on)."""
        ...


@attrs.define
class FollowerProgress:
    replica_id: str
    log_end: int = 0
    durable_end: int = 0
    last_fetch: float = -math.inf
    leader_end_at_last_fetch: int = 0
    caught_up: float = -math.inf  # when it last had everything the leader had made durable


class ReplicatedCommit:
    """The ``GroupCommit`` of a leader's appends: a ticket is the log end after an append, and
    it completes when the high watermark reaches it (see the module doc)."""

    def __init__(self, leader: LeaderReplica) -> None:
        self._leader = leader
        self.completed = leader.high_watermark
        self._listeners: set[FlushListener] = set()
        self._deadlines: deque[tuple[int, float]] = deque()  # (ticket, when it fails)
        self.deadline_added = trio.Event()  # the first deadline after none

    @property
    def healthy(self) -> bool:
        return self._leader.refusal() is None

    def request(self) -> int:
        ticket = self._leader.partition.log_end_offset
        if not self._deadlines or self._deadlines[-1][0] < ticket:
            if not self._deadlines:
                self.deadline_added.set()
            self._deadlines.append((ticket, trio.current_time() + self._leader.publish_timeout))
        return ticket

    def poke(self) -> None:
        flusher = self._leader.partition.flusher
        if flusher is not None:
            flusher.poke()

    def call_after_flush(self, callback: Callable[[], None]) -> None:
        flusher = self._leader.partition.flusher
        if flusher is not None:
            flusher.call_after_flush(callback)
        else:
            callback()

    async def wait(self, ticket: int) -> bool:
        waiter = _Waiter()
        self.listen(waiter)
        try:
            while self.completed < ticket and not waiter.failed:
                await waiter.changed.wait()
                waiter.changed = trio.Event()
            return not waiter.failed
        finally:
            self.unlisten(waiter)

    def listen(self, listener: FlushListener) -> None:
        self._listeners.add(listener)

    def unlisten(self, listener: FlushListener) -> None:
        self._listeners.discard(listener)

    def advanced(self, high_watermark: int) -> None:
        """The high watermark moved: tickets up to it are confirmed."""
        if high_watermark <= self.completed:
            return
        self.completed = high_watermark
        while self._deadlines and self._deadlines[0][0] <= high_watermark:
            self._deadlines.popleft()
        for listener in list(self._listeners):
            listener.flushed(self)

    def fail(self, upto: int) -> None:
        """Tickets up to ``upto`` not confirmed yet never will be: their publishes are nacked."""
        if upto <= self.completed:
            return
        for listener in list(self._listeners):
            listener.flush_failed(self, upto)
        self.completed = upto
        while self._deadlines and self._deadlines[0][0] <= upto:
            self._deadlines.popleft()

    def expire(self, now: float) -> float:
        """Fail the tickets whose publish timeout passed; when the next one is due."""
        expired = 0
        while self._deadlines and self._deadlines[0][1] <= now:
            expired = self._deadlines.popleft()[0]
        if expired:
            self.fail(expired)
        return self._deadlines[0][1] if self._deadlines else math.inf


class _Waiter:
    def __init__(self) -> None:
        self.changed = trio.Event()
        self.failed = False

    def flushed(self, commit: GroupCommit) -> None:
        self.changed.set()

    def flush_failed(self, commit: GroupCommit, upto: int) -> None:
        self.failed = True
        self.changed.set()


class LeaderReplica:
    """The leader's side of one replicated partition (see the module doc); its ``run`` task
    keeps the ISR."""

    def __init__(
        self,
        key: str,
        partition: Partition,
        *,
        node_id: str,
        epoch: int,
        isr: Mapping[str, str],
        min_isr: int,
        writer: IsrWriter,
        high_watermark: int = 0,
        replica_lag: float = 10.0,
        publish_timeout: float = 30.0,
    ) -> None:
        self.key = key
        self.partition = partition
        self.node_id = node_id
        self.epoch = epoch
        # As committed: node id -> replica id ("": the leader of a new partition, which
        # writes its own id first).
        self.isr: dict[str, str] = dict(isr)
        self.min_isr = min_isr
        self.replica_lag = replica_lag
        self.publish_timeout = publish_timeout
        self._writer = writer
        # Never above what this replica holds durably (a new leader's old view may be).
        self._high_watermark = min(high_watermark, partition.durable_end)
        self.followers: dict[str, FollowerProgress] = {}
        self.commit = ReplicatedCommit(self)
        self.resigned: str | None = None  # why it stepped down (then it refuses everything)
        self._changed = trio.Event()  # a fetch saw a follower join or fall behind

    # -- the gate (``broker.streams.ReplicaGate``) --------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def forward(self, messages: Sequence[Message]) -> list[Durability] | None:
        return None  # a leader takes appends itself: its refusal stands

    def offset_stored(
        self, kind: OffsetKind, name: str, offset: int, fence: GroupFence | None = None
    ) -> None:
        pass  # the followers get it with their next fetch

    def refusal(self) -> OSError | None:
        if self.resigned is not None:
            return NotLeader(f"partition {self.key}: not the leader ({self.resigned})")
        if len(self.isr) < self.min_isr:
            return NotEnoughReplicas(
                f"partition {self.key}: {len(self.isr)} in-sync replica(s), {self.min_isr} required"
            )
        return None

    # -- becoming and stopping being the leader ------------------------------------------------

    async def begin_epoch(self) -> None:
        """Begin the epoch in the log, durably (its checkpoint fsync'd in a worker thread)."""
        await self.partition.begin_epoch(self.epoch)

    def begin(self) -> None:
        """Put the gate in front of the partition (its epoch begun: ``begin_epoch``)."""
        assert self.partition.leader_epoch == self.epoch, "begin_epoch first"
        self.partition.gate = self
        flusher = self.partition.flusher
        if flusher is not None:
            flusher.listen(self)
        self._advance()

    def resign(self, why: str) -> None:
        """Step down: appends are refused, waiting confirms fail (nacked), fetches are
        answered ``not leader``; the caller puts the next gate (a follower's) in place."""
        if self.resigned is not None:
            return
        self.resigned = why
        flusher = self.partition.flusher
        if flusher is not None:
            flusher.unlisten(self)
        self.commit.fail(self.partition.log_end_offset)
        self._changed.set()
        self.partition.wake()

    # -- FlushListener: this replica's own durable end moved -----------------------------------

    def flushed(self, commit: GroupCommit) -> None:
        self._advance()

    def flush_failed(self, commit: GroupCommit, upto: int) -> None:
        self._advance()  # what was durable before stays so; the rest waits for a later flush

    # -- the followers' fetches ----------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """Answer a follower's fetch, waiting up to ``request.max_wait`` for records."""
        partition = self.partition
        if request.epoch != self.epoch or self.resigned is not None:
            code = FENCED_EPOCH if request.epoch < self.epoch else UNKNOWN_EPOCH
            return self._response(error=code)
        if request.fetch_offset < partition.log_start_offset:
            return self._response(error=OUT_OF_RANGE)
        diverging = divergence(
            partition.epoch_history,
            partition.log_end_offset,
            request.last_epoch,
            request.fetch_offset,
            request.log_start,
        )
        if diverging is not None:
            return self._response(diverging=diverging)
        self._progress(request)
        offset = request.fetch_offset
        if partition.durable_end <= offset and request.max_wait > 0:
            deadline = trio.current_time() + request.max_wait
            await partition.wait_beyond(offset, deadline, durable=True)
            if self.resigned is not None:
                return self._response(error=FENCED_EPOCH)
        frames_epoch, following = epoch_at(partition.epoch_history, offset)
        end = partition.durable_end if following is None else min(following, partition.durable_end)
        frames, _next = partition.replica_frames(offset, end, request.max_bytes)
        offsets = None
        if request.offsets_version != partition.offsets_version:
            offsets = (dict(partition.tracked_offsets), dict(partition.group_offsets))
        return self._response(
            frames_epoch=frames_epoch,
            frames=frames,
            offsets=offsets,
            offsets_version=partition.offsets_version,
        )

    def _response(self, **fields: object) -> FetchResponse:
        partition = self.partition
        return FetchResponse(
            epoch=self.epoch,
            high_watermark=self._high_watermark,
            log_start=partition.log_start_offset,
            **fields,  # type: ignore[arg-type]
        )

    def _progress(self, request: FetchRequest) -> None:
        """Take what a matching fetch says of the follower's log."""
        now = trio.current_time()
        follower = request.follower
        progress = self.followers.get(follower)
        if progress is None or progress.replica_id != request.replica_id:
            progress = self.followers[follower] = FollowerProgress(request.replica_id)
        leader_end = self.partition.durable_end
        if request.fetch_offset >= leader_end:
            progress.caught_up = now
        elif request.fetch_offset >= progress.leader_end_at_last_fetch:
            progress.caught_up = max(progress.caught_up, progress.last_fetch)
        progress.log_end = request.fetch_offset
        progress.durable_end = min(request.durable_end, request.fetch_offset)
        progress.last_fetch = now
        progress.leader_end_at_last_fetch = leader_end
        if self._isr_change(now) is not None:
            self._changed.set()
        self._advance()

    # -- the high watermark ------------------------------------------------------------------

    def _advance(self) -> None:
        if self.resigned is not None or len(self.isr) < self.min_isr:
            return
        ends = [self.partition.durable_end]
        for node, replica_id in self.isr.items():
            if node == self.node_id:
                continue
            progress = self.followers.get(node)
            if progress is None or progress.replica_id != replica_id:
                return  # a member not heard from at this epoch holds it back
            ends.append(progress.durable_end)
        high_watermark = min(ends)
        if high_watermark > self._high_watermark:
            self._high_watermark = high_watermark
            self.commit.advanced(high_watermark)
            self.partition.wake()

    # -- the ISR -----------------------------------------------------------------------------

    def _isr_change(self, now: float) -> dict[str, str] | None:
        """The ISR this leader should propose now (None: keep it)."""
        isr = dict(self.isr)
        if isr.get(self.node_id) == "":  # a new partition: its leader's id is not written yet
            isr[self.node_id] = self.partition.replica_id
        for node, replica_id in self.isr.items():
            if node == self.node_id:
                continue
            progress = self.followers.get(node)
            if progress is not None and progress.replica_id != replica_id:
                del isr[node]  # another replica under the node's name: its log is not the one
            elif progress is not None and progress.durable_end < self._high_watermark:
                del isr[node]  # it lost records it had acknowledged
            else:
                caught_up = progress.caught_up if progress is not None else -math.inf
                if now - max(caught_up, self._since) > self.replica_lag:
                    del isr[node]
        for node, progress in self.followers.items():
            if (
                node not in isr
                and progress.caught_up >= progress.last_fetch  # had all at its last fetch
                and now - progress.last_fetch <= self.replica_lag
                and progress.durable_end >= self._high_watermark
            ):
                isr[node] = progress.replica_id
        return isr if isr != self.isr else None

    _since = -math.inf  # when this leader began (members not heard from get replica_lag)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the ISR (shrinks and expands through the writer) and fail confirms past their
        publish timeout (even while an ISR write waits for etcd), until resigned."""
        self._since = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire_confirms)
            task_status.started()
            while self.resigned is None:
                now = trio.current_time()
                change = self._isr_change(now)
                if change is not None:
                    await self._write(change)
                    continue
                with trio.move_on_after(self.replica_lag / 4):
                    await self._changed.wait()
                self._changed = trio.Event()
            nursery.cancel_scope.cancel()

    async def _expire_confirms(self) -> None:
        while True:
            due = self.commit.expire(trio.current_time())
            with trio.move_on_at(min(due, trio.current_time() + self.publish_timeout)):
                await self.commit.deadline_added.wait()
            self.commit.deadline_added = trio.Event()

    async def _write(self, isr: dict[str, str]) -> None:
        if not await self._writer.write_isr(self, isr):
            self.resign("fenced: the ISR write was refused")
            return
        if self.resigned is not None:
            return
        shrunk = len(isr) < len(self.isr)
        log.info("partition %s: ISR %s -> %s", self.key, sorted(self.isr), sorted(isr))
        self.isr = isr
        if shrunk and len(isr) < self.min_isr:
            self.commit.fail(self.partition.log_end_offset)  # Kafka: NOT_ENOUGH_REPLICAS
        self._advance()
