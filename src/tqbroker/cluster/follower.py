"""A partition's follower replica: it copies its leader's log, frame for frame (Kafka's
``ReplicaFetcherThread`` for one partition).

Responsibilities:
- the fetch loop: ask the leader for what follows this log's end, saying what of it is durable
  and the epoch of its last record; append the frames verbatim (``Partition.append_frames``,
  which checks every frame's CRC and offsets and copies the leader's epoch history), wait for
  this node's flusher to make them durable, and ask again (so each fetch reports a durable end
  the leader's high watermark can count);
- its own log first: before it copies anything, every frame it holds is read back, each CRC
  checked (``verify``; once per opened partition): a frame damaged while the node was down
  (bit rot, a bad sector) is not seen by recovery after a clean shutdown, which trusts the
  segments; found (or a read failed the log meanwhile), the log is failed: the replica
  reports itself not intact (it cannot lead), its fetches claim nothing, and once the leader
  answers one the log is thrown away and copied anew under a new replica id
  (``_copy_anew``): the ISR holds the old id, so the replica counts again, and may lead, only
  once it has caught up;
- a leader whose log starts past this log's end (retention removed what it lacks): the log is
  emptied and continues at the leader's log start (Kafka's ``truncateFullyAndStartAt``);
- divergence (KIP-101/KIP-320): when the leader answers that the logs diverged, cut this log
  back to where they agree (the lesser of the leader's and this log's end of that epoch) and
  fetch again; never below the high watermark this replica learned (a cut there would remove
  records the cluster confirmed: the replica stops instead and says why, so it drops out of
  the ISR and cannot lead);
- the gate in front of the partition (``broker.streams.ReplicaGate``): readers stop at the high
  watermark the leader last sent (and this log's durable end); appends are the leader's to
  take: forwarded to it (``forwarding.py``) when the node gave a way to send them, else
  refused; so are the consumers' offsets stored here, and the leader's come back with the
  fetches (a consumer resumes from its offset on any node).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import trio

from ..broker.streams.partition import CorruptLogError, GroupFence, OffsetKind, Partition
from ..model import Message
from ..plugins.spec import Durability, GroupCommit
from .fetch import OUT_OF_RANGE, FetchRequest, FetchResponse
from .forwarding import Forwarder, Send
from .leader import NotLeader

log = logging.getLogger(__name__)

RETRY_SECONDS: Final = 0.2  # after a failed fetch (the leader unreachable, fenced, ...)
MAX_RETRY_SECONDS: Final = 2.0

Fetch = Callable[[FetchRequest], Awaitable[FetchResponse]]

# Per opened partition a follower has read back (``verify``): None, its log was intact; else
# why a follower found it damaged (kept: a later role, standby or another leader to follow,
# does not make it intact again).
_checked: weakref.WeakKeyDictionary[Partition, str | None] = weakref.WeakKeyDictionary()


def damage_of(partition: Partition) -> str | None:
    """Why this replica may not lead (the replica report's ``intact``): a follower found its
    log damaged since the partition was opened, or its log failed (a read met a damaged
    frame); None when neither."""
    return _checked.get(partition) or partition.failure


class ReplicaDamaged(Exception):
    """This replica's log no longer holds what it acknowledged (a damaged or swapped segment):
    the leader asked for a cut below the high watermark, or a frame of it fails its CRC."""


class LogDamaged(ReplicaDamaged):
    """A frame of this replica's own log fails its CRC (or a read failed the log): the local
    evidence that lets the replica throw its log away and copy it anew from the leader."""


class FollowerReplica:
    """The follower's side of one replicated partition (see the module doc)."""

    def __init__(
        self,
        key: str,
        partition: Partition,
        *,
        node_id: str,
        leader: str,
        epoch: int,
        fetch: Fetch,
        high_watermark: int = 0,
        max_bytes: int = 1 << 20,
        max_wait: float = 0.5,
        forward: Send | None = None,
    ) -> None:
        self.key = key
        self.partition = partition
        self.node_id = node_id
        self.leader = leader
        self.epoch = epoch
        self._fetch = fetch
        self._high_watermark = min(high_watermark, partition.durable_end)
        self.max_bytes = max_bytes
        self.max_wait = max_wait
        self.damaged: str | None = None  # why it stopped copying (``ReplicaDamaged``)
        self.copied_anew = 0  # times its damaged log was thrown away and copied anew
        self.last_error: str | None = None  # the last failed fetch's error (for status)
        self.fetches = 0  # answered fetches (for tests and metrics)
        self.forwarder = Forwarder(key, leader, forward) if forward is not None else None
        self._offsets_version = -1  # the version of the leader's offsets taken

    # -- the gate ----------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def refusal(self) -> OSError | None:
        return NotLeader(f"partition {self.key}: led by node {self.leader}")

    @property
    def commit(self) -> GroupCommit:
        raise NotLeader(f"partition {self.key}: a follower takes no appends")

    def forward(self, messages: Sequence[Message]) -> list[Durability] | None:
        return None if self.forwarder is None else self.forwarder.forward(messages)

    def offset_stored(
        self, kind: OffsetKind, name: str, offset: int, fence: GroupFence | None = None
    ) -> None:
        if self.forwarder is not None:
            self.forwarder.store_offset(kind, name, offset, fence)

    def begin(self) -> None:
        self.partition.gate = self

    # -- the fetch loop ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Copy the leader's log, and forward publishes to it, until cancelled (or until this
        replica is found damaged)."""
        async with trio.open_nursery() as nursery:
            if self.forwarder is not None:
                nursery.start_soon(self.forwarder.run)
                nursery.start_soon(self.forwarder.run_offsets)
            task_status.started()
            await self._copy()
            nursery.cancel_scope.cancel()

    async def verify(self) -> None:
        """Read back every frame of this log below its durable end, a chunk of ``max_bytes``
        at a time (each frame's CRC checked); ``ReplicaDamaged`` at the first damaged one. Done
        once per opened partition (a new leader to follow does not read it all again)."""
        partition = self.partition
        recorded = _checked.get(partition)
        if recorded is not None:
            raise ReplicaDamaged(recorded)
        if partition.failure is not None:
            raise LogDamaged(partition.failure)
        if partition in _checked:
            return
        offset, end = partition.log_start_offset, partition.durable_end
        try:
            while offset < end:
                frames, offset = partition.replica_frames(offset, end, self.max_bytes)
                if not frames:
                    break
                await trio.lowlevel.checkpoint()
        except CorruptLogError as exc:
            raise LogDamaged(f"a frame of its log is damaged: {exc}") from None
        _checked[partition] = None

    async def _copy(self) -> None:
        partition = self.partition
        try:
            await self.verify()
        except LogDamaged as exc:  # the log is failed now: copied anew once the leader answers
            log.error("partition %s: replica damaged: %s", self.key, exc)
        except ReplicaDamaged as exc:
            self._found_damaged(exc)
            return
        backoff = RETRY_SECONDS
        while True:
            try:
                response = await self._fetch(self._request())
            except Exception as exc:  # the link or the leader: try again, slower and slower
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.debug("partition %s: fetch from %s failed: %s", self.key, self.leader, exc)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, MAX_RETRY_SECONDS)
                continue
            self.fetches += 1
            if partition.failure is not None and response.error in (None, OUT_OF_RANGE):
                await self._copy_anew(partition.failure)  # the leader answers: it has the log
                continue
            if response.error == OUT_OF_RANGE and response.log_start > partition.log_end_offset:
                # Retention on the leader passed this log's end (the node was down, or a new
                # replica joins late): what is missing is gone everywhere; start at its start.
                log.warning(
                    "partition %s: the leader's log starts at %d, past this log's end %d: "
                    "the log is emptied and continues there",
                    self.key,
                    response.log_start,
                    partition.log_end_offset,
                )
                await partition.restart_at(response.log_start)
                continue
            if response.error is not None:
                self.last_error = response.error
                await trio.sleep(backoff)
                backoff = min(backoff * 2, MAX_RETRY_SECONDS)
                continue
            backoff = RETRY_SECONDS
            try:
                await self._apply(response)
            except ReplicaDamaged as exc:
                self._found_damaged(exc)
                return
            except OSError as exc:  # this node's storage: wait, then fetch from where it ends
                self.last_error = f"storage: {exc}"
                log.error("partition %s: cannot append the leader's frames: %s", self.key, exc)
                await trio.sleep(backoff)

    async def _copy_anew(self, damage: str) -> None:
        """Throw the damaged (failed) log away and copy it anew from the leader, which has
        just answered, under a new replica id: the ISR holds the old one, so this replica
        counts again only once it has caught up (and may lead only then). Its stored and
        group offsets stay."""
        partition = self.partition
        log.error(
            "partition %s: replica damaged (%s): its log is emptied and copied anew from %s",
            self.key,
            damage,
            self.leader,
        )
        await partition.restart_at(partition.log_start_offset, new_identity=True)
        _checked[partition] = None
        self.copied_anew += 1

    def _found_damaged(self, exc: ReplicaDamaged) -> None:
        self.damaged = _checked[self.partition] = str(exc)
        log.error("partition %s: replica damaged, not copying: %s", self.key, exc)

    def _request(self) -> FetchRequest:
        partition = self.partition
        if partition.failure is not None:  # damaged: claims nothing, asks for nothing
            start = partition.log_start_offset
            return FetchRequest(
                partition=self.key,
                follower=self.node_id,
                replica_id=partition.replica_id,
                epoch=self.epoch,
                fetch_offset=start,
                durable_end=start,
                last_epoch=partition.leader_epoch,
                max_bytes=0,
                max_wait=0,
                log_start=start,
            )
        return FetchRequest(
            partition=self.key,
            follower=self.node_id,
            replica_id=partition.replica_id,
            epoch=self.epoch,
            fetch_offset=partition.log_end_offset,
            durable_end=partition.durable_end,
            last_epoch=partition.leader_epoch,
            max_bytes=self.max_bytes,
            max_wait=self.max_wait,
            offsets_version=self._offsets_version,
            log_start=partition.log_start_offset,
        )

    async def _apply(self, response: FetchResponse) -> None:
        partition = self.partition
        if response.diverging is not None:
            epoch, leader_end = response.diverging
            end = min(leader_end, partition.end_offset_for_epoch(epoch))
            if end < self._high_watermark:
                raise ReplicaDamaged(
                    f"the leader's log diverges at {end}, below the high watermark "
                    f"{self._high_watermark}"
                )
            log.info(
                "partition %s: diverged from %s; log cut back to %d", self.key, self.leader, end
            )
            await partition.truncate_to(end)
            return
        if response.frames:
            _end, durability = await partition.append_frames(response.frames, response.frames_epoch)
            if durability is not None:
                commit, ticket = durability
                if not await commit.wait(ticket):
                    raise OSError("the flush of the copied frames failed")
        if response.offsets is not None:
            partition.take_offsets(*response.offsets)
            self._offsets_version = response.offsets_version
        high_watermark = min(response.high_watermark, partition.durable_end)
        if high_watermark > self._high_watermark:
            self._high_watermark = high_watermark
            partition.wake()
