"""A stream's storage: one segmented log, read by offset or timestamp, never consumed.

Responsibilities (``LogStream``, the ``StreamLog`` contract over one log):
- append (every record persistent: a stream keeps what it is given) through the open record
  batch (``batching.py``), read a record by offset or the first one at or after an offset, find
  the first offset at or after a timestamp, the first and next offsets;
- strict reads: the log is opened ``strict``, so a damaged frame fails the stream
  (``failure``) and every read raises ``CorruptLogError``;
- retention per whole segment, Kafka's way (``x-max-length-bytes``, ``x-max-age``), never the
  active segment; removed segments are deleted at the next flush;
- the flush protocol the log backend's flushes drive (``begin_flush`` / ``close`` / ``abandon``,
  the skeleton in ``flush.py``), like ``LogQueueStore``'s, without ack state: readers keep
  their own positions; ``durable_end``, where readers stop;
- stored positions and producer states (``streamstate.py``), made durable by the next flush;
- replication (``replication.py``, ``epochs.py``): ``append_frames`` (a leader's frames,
  verbatim), the leader epoch history (its checkpoint written before the call that changes it
  returns), truncation (``_Truncation``'s steps: durable, finished at the next open if a crash
  cut it short), the replica id;
- compaction, Kafka's ``cleanup.policy=compact`` (``compaction.py``): a pass planned here and
  run in a worker thread, its copies swapped in on the Trio thread.

Recovery after a crash rescans the segments written since the last flush (``recovery_point`` in
``stream.cbor``), as queue logs do. Just over 400 lines, as one job: the ``StreamLog`` contract,
each part the few lines that tie a piece (the batch, the log, the epochs, compaction, the stored
state) to the flush protocol they share; the pieces live in their own modules.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import cbor2

from ...model import Message
from ..streams import CompactionPolicy, ProducerState, TruncationSteps
from .batching import OpenBatch
from .compaction import CompactionResult, Compactor
from .epochs import EpochHistory
from .flush import ChangeFlag, Checkpoint, LogFlush
from .format import Record, encode_kafka_frame
from .log import RESOURCE_ERRNOS, Log
from .replication import (
    Intent,
    check_frames,
    clear_intent,
    load_replica_id,
    new_replica_id,
    pending_truncation,
    write_intent,
)
from .streamstate import STATE_FILE, StreamState

log = logging.getLogger(__name__)


class LogStream:
    _offsets_dirty = ChangeFlag()  # stored offsets changed since the checkpoint

    def __init__(self, directory: Path, log: Log) -> None:
        self.directory = directory
        self.log = log
        self.env = log.env
        self._durable_end = 0  # readers stop here: see ``durable_end``
        # The synced mark, the recovery point in stream.cbor on disk, the segments to delete
        # or close, truncations, the lock a delete takes: ``flush.py``.
        self.flush = LogFlush(log, on_synced=self._synced)
        # Stored offsets, group offsets and producer states: ``stream.cbor``.
        self.state = StreamState()
        self.epochs = EpochHistory()
        self._replica_id = ""
        log.reader.strict = True  # a damaged frame fails the stream: never stepped over
        # Held by ``begin_flush`` and by a truncation (worker thread): no flush begins while
        # the log is being cut back.
        self._flush_gate = threading.Lock()
        self.truncating = False  # a truncation's steps are under way: no retention, no compaction
        self._offsets_dirty = False
        self._compactor = Compactor(log, directory)
        self._batch = OpenBatch(log)

    def open(self) -> None:
        try:
            stored = cbor2.loads((self.directory / STATE_FILE).read_bytes())
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:
                raise  # out of descriptors or memory: the open fails, the state file is fine
            stored = None
        except (ValueError, cbor2.CBORDecodeError):
            stored = None
        self.state = StreamState(stored)
        recovery_point = self.state.recovery_point
        self.log.open(recovery_point=recovery_point)
        self.flush.synced_upto = self.flush.recovery_written = recovery_point
        self._durable_end = self.log.next_offset  # what recovery found is on disk
        self.epochs = EpochHistory.load(self.directory)
        self._replica_id = load_replica_id(self.env, self.directory)
        pending = pending_truncation(self.directory)
        if pending is not None:  # a power cut interrupted it: finish it
            steps = self._truncation(pending)
            steps.prepare()
            steps.cut()
            steps.finish()
        else:  # epochs past the end lost their records to the crash (the start stays)
            end = self.log.next_offset
            self.epochs.save(
                self.env,
                self.directory,
                [e for e in self.epochs.entries if e[1] <= end],
                fsync=True,
            )

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def failure(self) -> str | None:
        return self.log.reader.failure

    @property
    def offsets(self) -> Mapping[str, int]:
        """Server-side offset tracking: the next offset each tracked consumer reads, by tag."""
        return self.state.offsets

    @property
    def group_offsets(self) -> Mapping[str, int]:
        """Consumer groups: the committed offset (the next one to read) of each, by name."""
        return self.state.group_offsets

    @property
    def producers(self) -> Mapping[str, ProducerState]:
        """Idempotent producers (HTTP bulk writes): epoch and next sequence, by producer id."""
        return self.state.producers

    # -- reading and writing -----------------------------------------------------------------

    def append(self, message: Message) -> int:
        """Append one record; return its offset. Raises ``OSError`` when storage refuses it."""
        offset = self.next_offset
        _appended, error = self.append_many((message,))
        if error is not None:
            raise error
        return offset

    def append_many(self, messages: Sequence[Message]) -> tuple[int, OSError | None]:
        """Add records to the open batch (``OpenBatch.add``)."""
        return self._batch.add(messages)

    def append_kafka_batch(
        self, exchange: str, batch: bytes, count: int, timestamp_ms: int
    ) -> tuple[int, OSError | None]:
        """Append a Kafka producer's batch of ``count`` records, its greatest timestamp
        ``timestamp_ms``, as one frame (``KafkaBatchLog.append_kafka_batch``): the open batch
        is sealed first, then the frame is written at ``next_offset``."""
        try:
            self.seal()
            offset = self.log.next_offset
            frame = encode_kafka_frame(offset, timestamp_ms, exchange, batch)
            self.log.append_frame(offset, offset + count - 1, timestamp_ms, frame)
        except OSError as exc:
            return 0, exc
        self._batch.generation += 1  # a flush from now on covers the frame
        return count, None

    def compress_batches(self, codec: int) -> None:
        """Compress the batches appended from now on with ``codec`` (``CompressingLog``)."""
        self.log.compression = codec

    def seal(self) -> None:
        """Write the open batch into the log (``OpenBatch.seal``)."""
        self._batch.seal()

    @property
    def batch_generation(self) -> int:
        return self._batch.generation

    def read(self, offset: int) -> Record | None:
        """The record at ``offset``; None below the first offset, at the end, for an offset
        that compaction removed, or for a record that is damaged (logged by the log)."""
        self.seal()
        self.log.reader.check_failed()
        if offset < self.first_offset:
            return None
        return self.log.reader.read(offset)

    def read_from(self, offset: int) -> Record | None:
        """The first record at or after ``offset`` (or the first offset); None when there is
        none yet. A reader goes on from the record's offset + 1: this steps over the gaps that
        compaction leaves (and damaged records, logged by the log)."""
        self.seal()
        self.log.reader.check_failed()
        return self.log.reader.read_from(max(offset, self.first_offset))

    def read_many(self, offset: int, end: int, limit: int) -> list[Record]:
        """Up to ``limit`` records from the first at or after ``offset``, all below ``end``:
        ``read_from`` for a reader that takes many (a whole batch is taken at once)."""
        self.seal()
        self.log.reader.check_failed()
        return self.log.reader.read_many(max(offset, self.first_offset), end, limit)

    def read_frames(
        self, offset: int, end: int, max_bytes: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """The log's frames that hold the records from ``offset`` on, below ``end`` (at most
        the durable end: those are all written out), as they lie on disk."""
        self.log.reader.check_failed()
        end = min(end, self._durable_end)
        return self.log.reader.read_frames(max(offset, self.first_offset), end, max_bytes)

    # -- replication (``replication.py``, ``epochs.py``) ---------------------------------------

    def append_frames(self, frames: Sequence[tuple[bytes, bytes]], leader_epoch: int) -> int:
        """Append a leader's frames verbatim (``StreamLog.append_frames``); return the new
        next offset."""
        self.seal()
        start = self.log.next_offset
        checked = check_frames(frames, start)
        begun = self.epochs.begun(leader_epoch, start)
        if begun is not None and checked:
            self.epochs.save(self.env, self.directory, begun, fsync=True)
        if checked:
            self.log.append_frames(checked)
        return self.log.next_offset

    def begin_epoch(self, epoch: int) -> None:
        """Begin leader epoch ``epoch`` at ``next_offset``, durably (blocking)."""
        self.seal()
        begun = self.epochs.begun(epoch, self.log.next_offset)
        if begun is not None:
            self.epochs.save(self.env, self.directory, begun, fsync=True)

    @property
    def leader_epoch(self) -> int:
        return self.epochs.latest

    @property
    def epoch_history(self) -> list[tuple[int, int]]:
        return list(self.epochs.entries)

    def end_offset_for_epoch(self, epoch: int) -> int:
        return self.epochs.end_offset_for(epoch, self.next_offset)

    def begin_truncation(self, offset: int) -> TruncationSteps | None:
        """Begin cutting the log back to ``offset`` (``StreamLog.begin_truncation``). The
        flush gate is held from now, and ``flush.lock`` from ``prepare``, until the last step
        ends (done or failed): no flush begins, and none in flight writes its checkpoint."""
        self.seal()
        if offset >= self.log.next_offset:
            return None
        return self._truncation(Intent(offset)).steps()

    def begin_restart(self, offset: int, *, new_identity: bool = False) -> TruncationSteps:
        """Begin emptying the log and continuing it at ``offset``
        (``StreamLog.begin_restart``), as ``begin_truncation`` cuts it."""
        self.seal()
        return self._truncation(Intent(offset, True, new_identity)).steps()

    def _truncation(self, intent: Intent) -> _Truncation:
        self._flush_gate.acquire()
        self.truncating = True
        return _Truncation(self, intent)

    @property
    def first_offset(self) -> int:
        """No record is below it (the record there may have been compacted away)."""
        return self.log.start_offset

    @property
    def next_offset(self) -> int:
        return self.log.next_offset + len(self._batch.entries)

    @property
    def durable_end(self) -> int:
        """The flushed end: below it every record is fsync'd (``batch``), or written to the
        page cache under the ``interval`` and ``never`` policies (what they promise)."""
        return self._durable_end

    def store_offset(self, consumer_tag: str, offset: int) -> None:
        """Remember where a tracked consumer goes on (durable after the next flush)."""
        if self.state.store_offset(consumer_tag, offset):
            self._offsets_dirty = True

    def commit_group_offset(self, group: str, offset: int) -> None:
        """Remember a consumer group's committed offset (durable after the next flush)."""
        if self.state.commit_group_offset(group, offset):
            self._offsets_dirty = True

    def record_producer(self, producer: str, epoch: int, sequence: int) -> None:
        """Remember an idempotent producer's epoch and the next sequence its writes expect
        (durable after the next flush, with the records it wrote)."""
        if self.state.record_producer(producer, epoch, sequence):
            self._offsets_dirty = True

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        self.seal()
        self.log.reader.check_failed()
        return max(self.log.reader.offset_for_timestamp(timestamp_ms), self.first_offset)

    def apply_retention(self, *, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Detach whole segments past retention (deleted at the next flush); return how many."""
        self.seal()
        if self.truncating:
            return 0  # the next pass does it
        removed = self.log.segments_past_retention(
            max_bytes=max_bytes, max_age_ms=max_age_ms, now_ms=now_ms
        )
        self.flush.obsolete.extend(removed)
        if removed:
            self.log.changed()
        return len(removed)

    # -- compaction --------------------------------------------------------------------------

    def compaction_work(
        self, policy: CompactionPolicy, now_ms: int
    ) -> Callable[[], CompactionResult] | None:
        """Plan a compaction pass; None when there is nothing to do (no segment closed since
        the last pass with the same policy, and no tombstone's grace over). Otherwise the work,
        to run in a worker thread (it raises OSError if it cannot write), whose result goes to
        ``finish_compaction``; one pass at a time. The work reads only the bytes written out
        now, through descriptors of its own: appends, reads and retention go on meanwhile.
        It keeps, in every closed segment, the records whose key has no later record in the
        log as of now (the active segment's included), except tombstones whose
        ``timestamp_ms + tombstone_grace_ms <= now_ms``. It fsyncs the records it goes by
        first, so a copy never drops a record for the sake of a later one a crash can lose."""
        self.seal()
        if self.flush.abandoned or self.truncating:
            return None
        return self._compactor.plan(policy, now_ms)

    def finish_compaction(self, result: CompactionResult) -> int:
        """Swap the compacted copies in (``Compactor.install``: renames only, oldest first);
        return how many records they removed. The replaced segments are closed, and the
        renames made durable, by the next flush."""
        if self.flush.abandoned or not self.log.segments:  # deleted or closed meanwhile
            for swap in result.swaps:
                if swap.new is not None:
                    swap.new.close()  # its files go with the directory, or at the next open
            return 0
        return self._compactor.install(result, self.flush.retired)

    # -- the flush protocol ------------------------------------------------------------------

    @property
    def needs_flush(self) -> bool:
        flush = self.flush
        return self.log.needs_sync or bool(
            self._batch.entries or flush.obsolete or self._offsets_dirty or flush.retired
        )

    def begin_flush(self, *, fsync: bool = True) -> Callable[[], None] | None:
        """Write out buffered records; return the blocking work (``LogFlush.work``): fsync
        (unless ``fsync`` is false), record the recovery point, delete segments past retention,
        close the segments compaction replaced and make its renames durable. Nothing while a
        truncation runs (``needs_flush`` stays true: a later flush does it)."""
        if not self._flush_gate.acquire(blocking=False):
            return None
        try:
            return self._begin_flush(fsync)
        finally:
            self._flush_gate.release()

    def _begin_flush(self, fsync: bool) -> Callable[[], None] | None:
        self.seal()
        # A flush begins: a flush ticket taken before now is covered by it, so appends from
        # now on need a later one (even when no batch was open: the last may have been sealed
        # by an append that filled it).
        self._batch.generation += 1
        written = self.log.next_offset
        sync = self.flush.sync_work(fsync)
        if not fsync:
            self._durable_end = written  # in the page cache: all that this policy promises
        checkpoint = partial(self._checkpoint, fsync, sync is not None)
        return self.flush.work(sync, due=self._offsets_dirty, checkpoint=checkpoint)

    def _checkpoint(self, fsync: bool, synced: bool, synced_upto: int) -> Checkpoint:
        """A full flush's ``stream.cbor``, taken now: the stored positions and producer states,
        the recovery point ``synced_upto`` (fsync'd by this flush if ``synced``)."""
        state = self.state.encode(synced_upto)
        offsets_dirty, self._offsets_dirty = self._offsets_dirty, False
        flush = self.flush

        def write(current: bool) -> None:
            # A truncation since it began wrote stream.cbor with a lower recovery point and
            # durable end: this flush's are stale.
            if not current:
                return
            # Synced whenever the policy syncs this flush (not only when records were): an
            # unsynced checkpoint renamed over the durable one can reach the disk as the
            # rename without its bytes, and an unreadable stream.cbor loses every stored offset
            # (a retention-only flush did that).
            self.env.atomic_write(self.directory / STATE_FILE, state, fsync=fsync or offsets_dirty)
            flush.recovery_written = max(flush.recovery_written, synced_upto)
            flush.synced_upto = max(flush.synced_upto, synced_upto)
            if synced:
                self._durable_end = max(self._durable_end, synced_upto)

        def failed() -> None:
            self._offsets_dirty = self._offsets_dirty or offsets_dirty

        return Checkpoint(write, failed)

    def _synced(self, synced_upto: int) -> None:
        """A flush that wrote no checkpoint made the records below ``synced_upto`` durable."""
        self._durable_end = max(self._durable_end, synced_upto)

    def close(self) -> None:
        work = self.begin_flush()
        if work is not None:
            work()
        for segment in self.log.segments:
            segment.sync()
        self.log.close(clean=True)

    def abandon(self, move_to: Path) -> None:
        """The stream is being deleted (``LogFlush.abandon``)."""
        self.flush.abandon(move_to)

    def close_abandoned(self) -> None:
        flush = self.flush
        for segment in flush.retired:
            segment.close()
        flush.retired.clear()
        self.log.close(clean=False)


class _Truncation:
    """One truncation of ``stream`` to ``offset`` (``LogStream.begin_truncation``; with
    ``restart``, everything removed and the log continued at ``offset``), begun with the flush
    gate held: the intent first (from then on a power cut is finished by the next
    open), the files cut, then their fsync, the epoch history trimmed, ``stream.cbor`` with
    the recovery point moved down, and the intent removed. The gate, and ``flush.lock`` once
    taken, are released when a step fails or the last one ends."""

    def __init__(self, stream: LogStream, intent: Intent) -> None:
        self.stream = stream
        self.intent = intent
        self.offset = intent.offset
        self.restart = intent.restart
        self._locked = False
        self._end = intent.offset
        self._sync: Callable[[], None] | None = None
        self._state = b""

    def steps(self) -> TruncationSteps:
        return TruncationSteps(self.prepare, self.cut, self.finish)

    def prepare(self) -> None:
        stream = self.stream
        try:
            stream.flush.lock.acquire()  # a flush in flight writes its checkpoint first
            self._locked = True
            write_intent(stream.env, stream.directory, self.intent)
        except BaseException:
            self._release()
            raise

    def cut(self) -> None:
        stream, flush = self.stream, self.stream.flush
        try:
            if self.restart:
                end, removed = self.offset, stream.log.restart_at(self.offset)
            else:
                end, removed = stream.log.truncate(self.offset)
            flush.retired.extend(removed)  # closed by the next flush: one in flight may sync them
            self._sync = stream.log.sync_work()
            flush.truncated(end)
            if self.restart:  # no record below the new start: all of it is durable at once
                flush.synced_upto = stream._durable_end = end
            stream._durable_end = min(stream._durable_end, end)
            stream.state.clamp(end)
            stream._offsets_dirty = False
            self._end = end
            self._state = stream.state.encode(flush.synced_upto)
        except BaseException:
            self._release()
            raise

    def finish(self) -> None:
        stream = self.stream
        env, directory = stream.env, stream.directory
        try:
            if self._sync is not None:
                self._sync()
            epochs = [] if self.restart else stream.epochs.truncated(self._end)
            stream.epochs.save(env, directory, epochs, fsync=True)
            if self.intent.new_identity:
                stream._replica_id = new_replica_id(env, directory)
            env.atomic_write(directory / STATE_FILE, self._state)
            clear_intent(env, directory)
        finally:
            self._release()

    def _release(self) -> None:
        stream = self.stream
        if self._locked:
            self._locked = False
            stream.flush.lock.release()
        stream.truncating = False
        stream._flush_gate.release()
