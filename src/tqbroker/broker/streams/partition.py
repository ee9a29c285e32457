"""One partition of a stream, in the shape of Kafka's ``Partition``: its log (a ``StreamLog``),
its high watermark, its committed offsets and its producers' state.

Everything above storage reads and writes a stream through a ``Partition``: the AMQP stream
queue (``queue.py``), the topic service (``service.py``: HTTP, the command line, Spark, the
Kafka listener), the management API and the metrics. None of them reads the log's ends.

Responsibilities:
- the ends: ``log_start_offset`` (nothing is below it), ``high_watermark`` (readers stop here:
  on one node it is the log's durable end, so no reader ever sees an offset that a crash could
  give to another record; in a cluster it will be what the replicas hold), ``log_end_offset``
  (the next offset an append gets);
- appends (``append``): a run of messages in order, with what their confirms wait for (one
  flush ticket per record batch: while the log's ``batch_generation`` stays the same, the same
  flush makes every append durable);
- reads below the high watermark: records one by one or in bulk, the log's frames as they lie
  on disk, the first offset at or after a time;
- the long poll (``wait_beyond``): wait until the high watermark passes an offset, or a
  deadline (a fetch that waits for data, a follower's fetch);
- committed offsets: a consumer group's (Kafka's ``__consumer_offsets``) and a tracked
  consumer's (server-side offset tracking), durable at the next flush;
- idempotent producers: the next sequence each producer id expects, kept with the partition
  whose records it wrote, durable with them;
- retention and compaction, run by the owner's actor;
- the gate a cluster puts in front of a replicated partition (``ReplicaGate``, set by
  ``tqbroker.cluster``): the high watermark its replicas agree on, whether appends are taken
  here (only a leader with enough in-sync replicas takes them) and what their confirms wait
  for (every in-sync replica's fsync, not the local flush alone). Without a gate the partition
  is a single node's: its high watermark is its durable end.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Literal, Protocol

import attrs
import trio

from ... import clock
from ...backends.kafka_batches import messages_of
from ...backends.streams import (
    CompactionPolicy,
    CompressingLog,
    KafkaBatchLog,
    ProducerState,
    StreamLog,
    StreamRecord,
    TruncationSteps,
)
from ...backends.streams import (
    CorruptLogError as CorruptLogError,  # what a damaged frame raises on a read (re-exported)
)
from ...model import Message
from ...plugins.spec import Durability, GroupCommit
from ...protocol.kafka.records import BatchHeader, decode_batch
from ..flusher import Flusher, Wakeable
from .idempotence import RecentBatches


@attrs.frozen
class StorageInfo:
    """What the backend says of the partition's storage (None where it does not say)."""

    segments: int | None
    bytes: int | None


OffsetKind = Literal["tracked", "group"]  # a tracked consumer's offset, a group's committed one


@attrs.frozen
class GroupFence:
    """Who commits a group's offset in a cluster: the member the assignment of ``generation``
    gave the partition to. A leader that knows a later generation giving the partition to
    another member refuses the commit (Kafka's generation fencing)."""

    member: str
    generation: int


class ReplicaGate(Protocol):
    """What a cluster puts in front of a replicated partition (a leader's or a follower's
    replica state, ``tqbroker.cluster.replica``)."""

    @property
    def high_watermark(self) -> int:
        """The offset the replicas agree on: readers stop here (and at the durable end)."""
        ...

    def refusal(self) -> OSError | None:
        """Why appends are not taken here now (not the leader, too few in-sync replicas),
        or None."""
        ...

    @property
    def commit(self) -> GroupCommit:
        """What an append's confirm waits for (``request()`` after the append: its ticket)."""
        ...

    def forward(self, messages: Sequence[Message]) -> list[Durability] | None:
        """Send refused appends where they are taken (a follower: to its leader): what each
        one's confirm waits for; None when they are not forwarded (the refusal stands)."""
        ...

    def offset_stored(
        self, kind: OffsetKind, name: str, offset: int, fence: GroupFence | None = None
    ) -> None:
        """A consumer's offset was stored here (a follower sends it to its leader, which
        sends every replica its offsets), by the member ``fence`` names (a group's)."""
        ...


class StreamReplication(Protocol):
    """Told by the vhosts when a stream's partition comes and goes on this node (a cluster's
    replica roles: ``tqbroker.cluster.roles``), which puts a gate in front of it at once."""

    def opened(self, vhost: str, queue: str, partition: Partition) -> None: ...

    def closed(self, vhost: str, queue: str) -> None: ...


class Partition:
    """One partition of a stream (see the module doc)."""

    def __init__(self, log: StreamLog, flusher: Flusher | None) -> None:
        self._log = log
        self.flusher = flusher
        # The flush ticket of the open record batch (see ``append``).
        self._batch_generation = -1
        self._batch_ticket = 0
        self._grown: trio.Event | None = None  # set when the high watermark moves (waiters)
        self.closed = False
        self.gate: ReplicaGate | None = None  # a cluster's replica state (module doc)
        self._readers: set[Wakeable] = set()  # told when the high watermark may have moved
        self._changing: trio.Event | None = None  # see ``changing``
        # Moves at every offset stored: a leader sends its followers the offsets when the
        # version they have differs (random at the start: no two runs share a version).
        self.offsets_version = random.getrandbits(60)
        # Kafka producers' last batches here (``idempotence.py``; their states are the log's).
        self.kafka_producers = RecentBatches()

    # -- the ends --------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """No record is below it (retention moves it)."""
        return self._log.first_offset

    @property
    def high_watermark(self) -> int:
        """Readers stop here: every record below it is durable (see the module doc), on
        every in-sync replica when the partition is replicated."""
        gate = self.gate
        durable_end = self._log.durable_end
        return durable_end if gate is None else min(durable_end, gate.high_watermark)

    @property
    def durable_end(self) -> int:
        """The end of what this replica's log made durable (at least the high watermark)."""
        return self._log.durable_end

    @property
    def log_end_offset(self) -> int:
        """The offset the next append gets."""
        return self._log.next_offset

    @property
    def message_count(self) -> int:
        """The records a reader can reach (retention and compaction gaps counted in)."""
        return self.high_watermark - self._log.first_offset

    def storage_info(self) -> StorageInfo:
        """Segments and bytes, when the backend's log says (the built-in one does)."""
        segments = getattr(getattr(self._log, "log", None), "segments", None)
        if segments is None:
            return StorageInfo(None, None)
        sizes = [getattr(s, "size", None) for s in segments]
        total = None if None in sizes else sum(s for s in sizes if s is not None)
        return StorageInfo(len(segments), total)

    @property
    def failure(self) -> str | None:
        """Why the partition's log failed (a damaged frame below the high watermark: every
        read then raises ``CorruptLogError``); None while it is healthy."""
        return self._log.failure

    def clamp(self, offset: int) -> int:
        """``offset`` moved into ``[log_start_offset, high_watermark]``."""
        return min(max(offset, self._log.first_offset), self.high_watermark)

    # -- appends ---------------------------------------------------------------------------------

    def append(self, messages: Sequence[Message]) -> tuple[int, list[Durability], OSError | None]:
        """Append a run of messages in order: the first one's offset, what each appended
        one's confirm waits for (as many as were appended), and why storage refused the one
        after them (else None). A replicated partition takes them only where its gate
        lets it (the leader), and their confirms wait for its in-sync replicas."""
        log = self._log
        first = log.next_offset
        gate = self.gate
        if gate is not None:
            refusal = gate.refusal()
            if refusal is not None:
                forwarded = gate.forward(messages)
                return (first, [], refusal) if forwarded is None else (first, forwarded, None)
        taken, error = log.append_many(messages)
        return first, self._confirms(taken), error

    def append_kafka_batch(
        self, exchange: str, batch: bytes, header: BatchHeader
    ) -> tuple[int, list[Durability], OSError | None]:
        """Append a Kafka producer's batch (``batch``, its bytes as produced; ``header``, its
        records checked by ``records.check_batch``) as ``append`` appends messages: kept
        as produced where the log can (``KafkaBatchLog``), as its records' messages elsewhere,
        and by a replica that forwards appends to its leader."""
        log = self._log
        gate = self.gate
        if not isinstance(log, KafkaBatchLog) or (gate is not None and gate.refusal()):
            return self.append(messages_of(exchange, decode_batch(batch)))
        first = log.next_offset
        stamp = header.max_timestamp if header.max_timestamp > 0 else clock.now_ms()
        taken, error = log.append_kafka_batch(exchange, batch, header.record_count, stamp)
        return first, self._confirms(taken), error

    def compress_batches(self, codec: int) -> None:
        """Store the record batches appended from now on compressed with ``codec`` (Kafka's
        ids), where the log can (``CompressingLog``); elsewhere as they are."""
        if isinstance(self._log, CompressingLog):
            self._log.compress_batches(codec)

    def _confirms(self, taken: int) -> list[Durability]:
        """What the confirms of ``taken`` records just appended wait for."""
        if not taken:
            return []
        log, gate = self._log, self.gate
        flusher = self.flusher
        if gate is not None:
            if flusher is not None:
                flusher.request()  # this replica's own fsync, which the high watermark needs
                if self._grown is not None:  # followers wait in a fetch: wake them after it
                    flusher.wake_after_flush(self)
            commit = gate.commit
            return [(commit, commit.request())] * taken
        if flusher is None:
            return [None] * taken
        if self._grown is not None:  # someone waits for these: make them durable soon
            flusher.wake_after_flush(self)
        # One flush ticket per record batch: until the batch is closed (by a flush, which
        # then covers the ticket, or by a read) the same flush makes all of it durable. Taken
        # after the run's appends, it covers a batch the run closed too.
        generation = log.batch_generation
        if generation != self._batch_generation or self._batch_ticket <= flusher.completed:
            self._batch_generation = generation
            self._batch_ticket = flusher.request()
        return [(flusher, self._batch_ticket)] * taken

    # -- reads (below the high watermark) --------------------------------------------------------

    def read_many(self, offset: int, limit: int, end: int | None = None) -> Sequence[StreamRecord]:
        """Up to ``limit`` records from the first at or after ``offset``, below ``end`` (at most
        the high watermark), in order. Raises ``OSError`` on storage trouble."""
        high_watermark = self.high_watermark
        stop = high_watermark if end is None else min(end, high_watermark)
        if offset >= stop:
            return []
        return self._log.read_many(offset, stop, limit)

    def read_from(self, offset: int) -> StreamRecord | None:
        """The first record at or after ``offset`` below the high watermark (None: none)."""
        record = self._log.read_from(offset)
        if record is None or record.offset >= self.high_watermark:
            return None
        return record

    def read_frames(
        self, offset: int, end: int | None, max_bytes: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """The log's frames holding the records from ``offset`` below ``end`` (at most the
        high watermark), about ``max_bytes`` of them (``StreamLog.read_frames``), and the
        offset the next read starts at."""
        high_watermark = self.high_watermark
        stop = high_watermark if end is None else min(end, high_watermark)
        if offset >= stop:
            return [], stop
        return self._log.read_frames(offset, stop, max_bytes)

    def replica_frames(
        self, offset: int, end: int, max_bytes: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """``read_frames`` for a follower's fetch: past the high watermark, up to ``end`` and
        the durable end (a follower copies what its leader made durable, before the high
        watermark covers it)."""
        stop = min(end, self._log.durable_end)
        if offset >= stop:
            return [], stop
        return self._log.read_frames(offset, stop, max_bytes)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose record is not older than ``timestamp_ms``, at most the high
        watermark (the high watermark: there is none yet)."""
        return min(self._log.offset_for_timestamp(timestamp_ms), self.high_watermark)

    # -- the long poll ---------------------------------------------------------------------------

    async def wait_beyond(self, offset: int, deadline: float, *, durable: bool = False) -> bool:
        """Wait until the high watermark (with ``durable``: the durable end, for a
        follower's fetch) is past ``offset`` (True) or Trio's clock reaches ``deadline`` or
        the partition is closed (False)."""
        log = self._log
        while (log.durable_end if durable else self.high_watermark) <= offset:
            if self.closed or trio.current_time() >= deadline:
                return False
            if self._grown is None:
                self._grown = trio.Event()
            grown = self._grown
            if log.next_offset > log.durable_end and self.flusher is not None:
                self.flusher.wake_after_flush(self)  # written, not durable yet: flush soon
            with trio.move_on_at(deadline):
                await grown.wait()
        return True

    def wake(self) -> None:
        """A flush has finished (``Flusher.wake_after_flush``), records came or the replicas
        agreed on more: the high watermark may have moved; waiters and readers look again."""
        grown, self._grown = self._grown, None
        if grown is not None:
            grown.set()
        for reader in self._readers:
            reader.wake()

    def add_reader(self, reader: Wakeable) -> None:
        """Wake ``reader`` (a stream queue's actor) whenever ``wake`` is called."""
        self._readers.add(reader)

    def remove_reader(self, reader: Wakeable) -> None:
        self._readers.discard(reader)

    def close(self) -> None:
        """The partition is gone (its stream deleted): waiters return."""
        self.closed = True
        self.wake()

    # -- committed offsets -----------------------------------------------------------------------

    @property
    def group_offsets(self) -> Mapping[str, int]:
        """Each consumer group's committed offset (the next one it reads), by name."""
        return self._log.group_offsets

    def commit_group_offset(self, group: str, offset: int, fence: GroupFence | None = None) -> None:
        """Commit a group's offset (durable at the next flush), for the member ``fence``
        names (a cluster's assignment)."""
        self._log.commit_group_offset(group, offset)
        self._offset_stored("group", group, offset, fence)

    @property
    def tracked_offsets(self) -> Mapping[str, int]:
        """Server-side offset tracking: the next offset each tracked consumer reads, by tag."""
        return self._log.offsets

    def store_offset(self, consumer_tag: str, offset: int) -> None:
        """Remember where a tracked consumer goes on (durable at the next flush)."""
        self._log.store_offset(consumer_tag, offset)
        self._offset_stored("tracked", consumer_tag, offset)

    def _offset_stored(
        self, kind: OffsetKind, name: str, offset: int, fence: GroupFence | None = None
    ) -> None:
        self.offsets_version += 1
        if self.gate is not None:
            self.gate.offset_stored(kind, name, offset, fence)

    def take_offsets(self, tracked: Mapping[str, int], groups: Mapping[str, int]) -> None:
        """The offsets a replicated partition's leader keeps (a follower takes them as
        they are: the leader's stand)."""
        for tag, offset in tracked.items():
            self._log.store_offset(tag, offset)
        for group, offset in groups.items():
            self._log.commit_group_offset(group, offset)
        if (tracked or groups) and self.flusher is not None:
            self.flusher.request()  # durable soon, records or not

    # -- idempotent producers --------------------------------------------------------------------

    def producer_state(self, producer: str) -> ProducerState | None:
        """What the partition keeps of an idempotent producer: its epoch and the next
        sequence its writes here expect (None: it never wrote here)."""
        return self._log.producers.get(producer)

    def record_producer(self, producer: str, epoch: int, next_sequence: int) -> None:
        """The producer (in ``epoch``) next writes ``next_sequence`` here (durable with the
        records it wrote, by the same flush)."""
        self._log.record_producer(producer, epoch, next_sequence)

    # -- replication (the log's primitives, for a cluster's leaders and followers) ---------------

    @property
    def replica_id(self) -> str:
        """This replica's identity: new whenever the partition's log is created."""
        return self._log.replica_id

    @property
    def leader_epoch(self) -> int:
        """The latest leader epoch of the log's history (``NO_EPOCH``: none yet)."""
        return self._log.leader_epoch

    @property
    def epoch_history(self) -> Sequence[tuple[int, int]]:
        """``(epoch, start_offset)`` of each leader epoch, oldest first."""
        return self._log.epoch_history

    def end_offset_for_epoch(self, epoch: int) -> int:
        """Kafka's ``OffsetsForLeaderEpoch``: where a follower whose last epoch is ``epoch``
        diverges from this log (``StreamLog.end_offset_for_epoch``)."""
        return self._log.end_offset_for_epoch(epoch)

    # A new epoch's checkpoint and a truncation block for their fsyncs: they run in a worker
    # thread (the truncation's cut itself on the Trio thread, so no read ever sees the log
    # halfway through), shielded, while ``changing`` says so: a role that takes over the
    # partition meanwhile (``tqbroker.cluster``) begins once it is over (``settled``). Nothing
    # appends meanwhile: a leader begins its epoch before it takes appends, a follower's fetch
    # appends after it.

    @property
    def changing(self) -> bool:
        """An epoch checkpoint or a truncation is under way."""
        return self._changing is not None

    async def settled(self) -> None:
        """Return once no epoch checkpoint or truncation is under way."""
        while self._changing is not None:
            await self._changing.wait()

    async def begin_epoch(self, epoch: int) -> None:
        """Begin leader epoch ``epoch`` at the log end (a leader, before it takes appends);
        the history is durable when it returns."""
        await self._change(partial(trio.to_thread.run_sync, self._log.begin_epoch, epoch))

    async def append_frames(
        self, frames: Sequence[tuple[bytes, bytes]], leader_epoch: int
    ) -> tuple[int, Durability]:
        """Append a leader's frames verbatim at the offsets they carry (a follower's fetch:
        ``StreamLog.append_frames``, which refuses frames that do not continue the log or do
        not check). The first frames of a new epoch begin it first, durably, in a worker
        thread. One fetcher per partition calls this. Returns the log's new end and what its
        durability waits for (the next flush)."""
        if frames and leader_epoch > self._log.leader_epoch:
            await self.begin_epoch(leader_epoch)
        end = self._log.append_frames(frames, leader_epoch)
        flusher = self.flusher
        return end, (flusher, flusher.request()) if flusher is not None else None

    async def truncate_to(self, offset: int) -> None:
        """Remove every record at or past ``offset`` (``StreamLog.begin_truncation``), durably.
        Waiters look again."""
        steps = self._log.begin_truncation(offset)
        if steps is not None:
            await self._change(partial(_truncate, steps))
            self.wake()

    async def restart_at(self, offset: int, *, new_identity: bool = False) -> None:
        """Remove every record and continue the log at ``offset``
        (``StreamLog.begin_restart``), durably: a follower whose log ends below its leader's
        log start, or whose log is damaged (``new_identity``). Waiters look again."""
        steps = self._log.begin_restart(offset, new_identity=new_identity)
        await self._change(partial(_truncate, steps))
        self.wake()

    async def _change(self, change: Callable[[], Awaitable[object]]) -> None:
        assert self._changing is None, "one role at a time changes the log"
        self._changing = trio.Event()
        try:
            with trio.CancelScope(shield=True):  # a change begun is finished
                await change()
        finally:
            self._changing.set()
            self._changing = None

    # -- retention and compaction ----------------------------------------------------------------

    def apply_retention(self, *, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Drop whole segments past retention; how many went (deleted at the next flush)."""
        return self._log.apply_retention(max_bytes=max_bytes, max_age_ms=max_age_ms, now_ms=now_ms)

    def compaction_work(self, policy: CompactionPolicy, now_ms: int) -> Callable[[], Any] | None:
        """A compaction pass's blocking work, or None (``StreamLog.compaction_work``)."""
        return self._log.compaction_work(policy, now_ms)

    def finish_compaction(self, result: Any) -> int:
        """Install a pass's result; how many records it removed."""
        return self._log.finish_compaction(result)


async def _truncate(steps: TruncationSteps) -> None:
    await trio.to_thread.run_sync(steps.prepare)
    steps.cut()
    await trio.to_thread.run_sync(steps.finish)


async def make_durable(partitions: Iterable[Partition]) -> bool:
    """Wait until what was committed to (or recorded by) these partitions so far is durable,
    one flush per backend; False if a flush failed."""
    flushers = list(dict.fromkeys(p.flusher for p in partitions if p.flusher is not None))
    for flusher in flushers:
        if not await flusher.wait(flusher.request()):
            return False
    return True
