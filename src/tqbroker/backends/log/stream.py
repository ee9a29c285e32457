"""A stream's storage: one segmented log, read by offset or timestamp, never consumed.

Responsibilities:
- ``LogStream``: append (every record persistent: a stream keeps what it is given), read a
  record by offset or the first one at or after an offset, find the first offset at or after a
  timestamp, the first and next offsets;
- record batches: appends collect in an open batch, written as one frame (one header, one
  CRC, one index entry, one cache entry) when anything reads or flushes the log, or when it
  reaches ``MAX_BATCH_RECORDS`` / ``MAX_BATCH_BYTES``: so the publishes of one read buffer (and
  of every connection served before the next flush) become one batch;
- retention per whole segment, Kafka's way (``x-max-length-bytes``, ``x-max-age``), never the
  active segment; removed segments are deleted at the next flush;
- the flush protocol the log backend's flushes drive (``begin_flush`` / ``close`` / ``abandon``),
  like ``LogQueueStore``'s, without ack state: readers keep their own positions;
- stored positions and producer states (``streamstate.py``), made durable by the next flush;
- replication (``replication.py``, ``epochs.py``): ``append_frames`` (a leader's frames,
  verbatim), the leader epoch history (its checkpoint written before the call that changes it
  returns), ``truncate_to`` (blocking, durable, finished at the next open if a crash cut it
  short), the replica id (``replica-id``, written when the directory is first opened);
- strict reads: the log is opened ``strict``, so a damaged frame fails the stream
  (``failure``) and every read raises ``CorruptLogError``;
- compaction, Kafka's ``cleanup.policy=compact`` (``CompactionPolicy``): ``compaction_work`` plans a
  pass and returns the blocking work, which writes compacted copies of the closed segments
  (the latest record of each key kept, offsets unchanged, so segments get gaps) in a scratch
  directory; ``finish_compaction`` moves them over the originals on the Trio thread. Each
  segment is swapped by one atomic rename, oldest first, so a crash leaves every segment whole
  in its old or its compacted form, and never a dropped tombstone with an older record of its
  key still on disk.

Recovery after a crash rescans the segments written since the last flush (``recovery_point`` in
``stream.cbor``), as queue logs do.

Over 400 lines, as one job: ``LogStream`` is the ``StreamLog`` contract over one log, and each
part above is the few lines that tie a piece (the log, compaction, the epochs, the stored
state) to the flush protocol they share; the pieces themselves live in their own modules.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from pathlib import Path

import cbor2

from ...model import Message
from ..streams import CompactionPolicy, ProducerState
from .changeflag import ChangeFlag
from .compaction import CompactionResult, Source, compact
from .epochs import EpochHistory
from .format import BATCH_OVERHEAD, ENTRY_OVERHEAD, FLAG_PERSISTENT, Record
from .log import COMPACTION_DIR, RESOURCE_ERRNOS, Log
from .replication import check_frames, clear_intent, pending_truncation, write_intent
from .segment import Segment
from .streamstate import STATE_FILE, StreamState

log = logging.getLogger(__name__)

REPLICA_FILE = "replica-id"  # the replica's UUID, written when the directory is created
_exchange = attrgetter("exchange")
_routing_key = attrgetter("routing_key")
_properties_raw = attrgetter("properties_raw")
_body = attrgetter("body")
_timestamp = attrgetter("timestamp_ms")
MAX_BATCH_RECORDS = 4096
MAX_BATCH_BYTES = 1024 * 1024


class LogStream:
    _offsets_dirty = ChangeFlag()  # stored offsets changed since the checkpoint

    def __init__(self, directory: Path, log: Log) -> None:
        self.directory = directory
        self.log = log
        self.env = log.env
        self._synced_upto = 0
        self._durable_end = 0  # readers stop here: see ``durable_end``
        self._recovery_written = 0  # the recovery point in stream.cbor on disk
        self._obsolete: list[Segment] = []
        # Stored offsets, group offsets and producer states: ``stream.cbor``.
        self.state = StreamState()
        self.epochs = EpochHistory()
        self._replica_id = ""
        log.strict = True  # a damaged frame fails the stream: never stepped over
        # Counts truncations: a flush that began before one must not write its (higher)
        # recovery point or durable end after it.
        self._truncations = 0
        # Held by ``begin_flush`` and by a truncation (worker thread): no flush begins while
        # the log is being cut back.
        self._flush_gate = threading.Lock()
        self._offsets_dirty = False
        self._lock = threading.Lock()
        self.abandoned = False
        # Segments replaced by compacted copies: closed by the next flush's work (a sync of
        # theirs may be in flight until then).
        self._retired: list[Segment] = []
        self._compaction_policy: CompactionPolicy | None = None
        self._compacted_upto = -1
        self._tombstone_due_ms: int | None = None
        # The open batch: appended records not yet in the log, (timestamp_ms, flags, message);
        # a message never stamped (0) gets the time of the seal.
        self._batch: list[tuple[int, int, Message]] = []
        self._batch_bytes = 0
        # Changes each time the open batch is sealed and each time a flush begins: appends
        # under one generation are made durable by the same flush (``StreamLog``).
        self.batch_generation = 0

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
        self._synced_upto = self._recovery_written = recovery_point
        self._durable_end = self.log.next_offset  # what recovery found is on disk
        self.epochs = EpochHistory.load(self.directory)
        self._replica_id = self._load_replica_id()
        pending = pending_truncation(self.directory)
        if pending is not None:  # a power cut interrupted it: finish it
            self._truncate(pending)
        else:  # epochs past the end lost their records to the crash (the start stays)
            end = self.log.next_offset
            self.epochs.save(
                self.env,
                self.directory,
                [e for e in self.epochs.entries if e[1] <= end],
                fsync=True,
            )

    def _load_replica_id(self) -> str:
        path = self.directory / REPLICA_FILE
        try:
            return str(uuid.UUID(path.read_text().strip()))
        except FileNotFoundError:
            pass
        except ValueError:  # a torn write of a new one: nothing relied on it yet
            pass
        replica_id = str(uuid.uuid4())
        self.env.atomic_write(path, replica_id.encode())
        return replica_id

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def failure(self) -> str | None:
        return self.log.failure

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
        """Add records to the open batch, in order: how many were, and the ``OSError`` that
        refused the next one (the open batch would overflow the active segment and could not
        be written out to make room), else None."""
        log = self.log
        segment_bytes = log.segment_bytes
        batch, total = self._batch, self._batch_bytes
        left = segment_bytes - log.segments[-1].size  # in the active segment
        # Most runs fit in the open batch and the active segment: added at once (C-level
        # loops), with the outcome of the loop below, which would seal nothing.
        count = len(messages)
        if not count:
            return 0, None
        grown = (total if batch else BATCH_OVERHEAD) + ENTRY_OVERHEAD * count
        grown += sum(map(len, map(_exchange, messages)))
        grown += sum(map(len, map(_routing_key, messages)))
        grown += sum(map(len, map(_properties_raw, messages)))
        grown += sum(map(len, map(_body, messages)))
        if grown <= left and grown < MAX_BATCH_BYTES and len(batch) + count < MAX_BATCH_RECORDS:
            if not batch:
                log.changed()  # the next flush seals and writes the batch
            batch.extend(zip(map(_timestamp, messages), repeat(FLAG_PERSISTENT), messages))
            self._batch_bytes = grown
            return count, None
        appended = 0
        try:
            for message in messages:
                size = (
                    ENTRY_OVERHEAD
                    + len(message.exchange)
                    + len(message.routing_key)
                    + len(message.properties_raw)
                    + len(message.body)
                )
                # A batch fills a segment at most (unless one record is bigger), or a whole
                # segment if it would roll anyway; and ``MAX_BATCH_BYTES`` at most, unless one
                # record is bigger: then it is a frame of its own (a batch of a near-1 MiB and
                # a 512 MiB message would be longer than any frame a reader accepts).
                if batch and (
                    total + size > (left if left >= total else segment_bytes)
                    or total + size > MAX_BATCH_BYTES
                ):
                    self._batch_bytes = total
                    self.seal()
                    batch, total = self._batch, 0
                    left = segment_bytes - log.segments[-1].size
                if not batch:
                    total = BATCH_OVERHEAD
                    log.changed()  # the next flush seals and writes the batch
                batch.append((message.timestamp_ms, FLAG_PERSISTENT, message))
                total += size
                appended += 1
                if len(batch) >= MAX_BATCH_RECORDS or total >= MAX_BATCH_BYTES:
                    # The record is in the batch now: a failure to write it out (no descriptor
                    # for a new segment) is the next flush's to retry and report, not this
                    # publish's.
                    self._batch_bytes = total
                    with contextlib.suppress(OSError):
                        self.seal()
                    batch, total = self._batch, self._batch_bytes
                    left = segment_bytes - log.segments[-1].size
        except OSError as exc:
            return appended, exc
        finally:
            self._batch_bytes = total
        return appended, None

    def seal(self) -> None:
        """Write the open batch into the log (buffered, as one frame). Raises OSError when
        the log cannot take it (a segment to roll to cannot be created): the batch then stays
        open, its offsets kept, and the next seal tries again."""
        if self._batch:
            self.log.append_batch(self._batch)  # all or nothing
            self._batch, self._batch_bytes = [], 0
            self.batch_generation += 1

    def read(self, offset: int) -> Record | None:
        """The record at ``offset``; None below the first offset, at the end, for an offset
        that compaction removed, or for a record that is damaged (logged by the log)."""
        self.seal()
        self.log.check_failed()
        if offset < self.first_offset:
            return None
        return self.log.read(offset)

    def read_from(self, offset: int) -> Record | None:
        """The first record at or after ``offset`` (or the first offset); None when there is
        none yet. A reader goes on from the record's offset + 1: this steps over the gaps that
        compaction leaves (and damaged records, logged by the log)."""
        self.seal()
        self.log.check_failed()
        return self.log.read_from(max(offset, self.first_offset))

    def read_many(self, offset: int, end: int, limit: int) -> list[Record]:
        """Up to ``limit`` records from the first at or after ``offset``, all below ``end``:
        ``read_from`` for a reader that takes many (a whole batch is taken at once)."""
        self.seal()
        self.log.check_failed()
        return self.log.read_many(max(offset, self.first_offset), end, limit)

    def read_frames(
        self, offset: int, end: int, max_bytes: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """The log's frames that hold the records from ``offset`` on, below ``end`` (at most
        the durable end: those are all written out), as they lie on disk."""
        self.log.check_failed()
        end = min(end, self._durable_end)
        return self.log.read_frames(max(offset, self.first_offset), end, max_bytes)

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

    def truncate_to(self, offset: int) -> None:
        """Cut the log back to ``offset`` (``StreamLog.truncate_to``; blocking, durable)."""
        self.seal()
        if offset >= self.log.next_offset:
            return
        with self._flush_gate:
            self._truncate(offset)

    def _truncate(self, offset: int) -> None:
        """The truncation's steps: the intent first (from then on a power cut is finished by
        the next open), the files cut and fsync'd, the epoch history trimmed, ``stream.cbor``
        with the recovery point moved down, and the intent removed."""
        with self._lock:
            write_intent(self.env, self.directory, offset)
            end, removed = self.log.truncate(offset)
            self._retired.extend(removed)  # closed by the next flush: one in flight may sync them
            sync = self.log.sync_work()
            if sync is not None:
                sync()
            self.epochs.save(self.env, self.directory, self.epochs.truncated(end), fsync=True)
            self._truncations += 1
            self._synced_upto = min(self._synced_upto, end)
            self._recovery_written = min(self._recovery_written, end)
            self._durable_end = min(self._durable_end, end)
            self.state.clamp(end)
            self._offsets_dirty = False
            self.env.atomic_write(self.directory / STATE_FILE, self.state.encode(self._synced_upto))
            clear_intent(self.env, self.directory)

    @property
    def first_offset(self) -> int:
        """No record is below it (the record there may have been compacted away)."""
        return self.log.start_offset

    @property
    def next_offset(self) -> int:
        return self.log.next_offset + len(self._batch)

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
        self.log.check_failed()
        return max(self.log.offset_for_timestamp(timestamp_ms), self.first_offset)

    def apply_retention(self, *, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Detach whole segments past retention (deleted at the next flush); return how many."""
        self.seal()
        removed = self.log.segments_past_retention(
            max_bytes=max_bytes, max_age_ms=max_age_ms, now_ms=now_ms
        )
        self._obsolete.extend(removed)
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
        segments = self.log.segments
        active = segments[-1]
        if len(segments) < 2 or self.abandoned:
            return None
        tombstone_due = self._tombstone_due_ms is not None and self._tombstone_due_ms <= now_ms
        if not (
            policy != self._compaction_policy
            or active.base_offset > self._compacted_upto
            or tombstone_due
        ):
            return None
        with contextlib.suppress(OSError):  # what cannot be written out now is left out
            self.log.write_out()
        sources = [Source(s, s.log_path, s.written, not s.pending) for s in segments]
        compacted_upto = min(
            [s.base_offset for s in segments[:-1] if s.pending] + [active.base_offset]
        )
        scratch = self.directory / COMPACTION_DIR
        interval = self.log.index_interval_bytes
        env = self.env

        def work() -> CompactionResult:
            return compact(env, policy, now_ms, sources, scratch, interval, compacted_upto)

        return work

    def finish_compaction(self, result: CompactionResult) -> int:
        """Swap the compacted copies in (renames only, oldest first); return how many records
        they removed. The segments that retention took meanwhile are skipped, and their files
        removed now rather than at the next flush: a crash must not bring back records that a
        copy's dropped tombstone deleted. The replaced segments are closed, and the renames
        made durable, by the next flush."""
        if self.abandoned or not self.log.segments:  # deleted or closed meanwhile
            for swap in result.swaps:
                if swap.new is not None:
                    swap.new.close()  # its files go with the directory, or at the next open
            return 0
        present = {id(segment) for segment in self.log.segments}
        for segment in result.planned:
            if id(segment) not in present:
                segment.unlink()
        removed = 0
        for swap in result.swaps:
            old, new = swap.old, swap.new
            if id(old) not in present:
                if new is not None:
                    new.delete()
                continue
            if new is None:
                old.unlink()
            else:  # a flush in flight may still sync the old files: they stay open
                old.keep_open()
                self.log.install(new)
            self.log.replace_segment(old, new)
            self._retired.append(old)
            self.log.changed()
            removed += swap.removed
        with contextlib.suppress(OSError):
            self.env.fs.rmdir(self.directory / COMPACTION_DIR)
        self._compaction_policy = result.policy
        self._compacted_upto = result.compacted_upto
        self._tombstone_due_ms = result.tombstone_due_ms
        return removed

    # -- the flush protocol ------------------------------------------------------------------

    @property
    def needs_flush(self) -> bool:
        return self.log.needs_sync or bool(
            self._batch or self._obsolete or self._offsets_dirty or self._retired
        )

    def begin_flush(self, *, fsync: bool = True) -> Callable[[], None] | None:
        """Write out buffered records; return the blocking work: fsync (unless ``fsync`` is
        false), record the recovery point, delete segments past retention, close the segments
        compaction replaced and make its renames durable. Nothing while a truncation runs
        (``needs_flush`` stays true: a later flush does it)."""
        if not self._flush_gate.acquire(blocking=False):
            return None
        try:
            return self._begin_flush(fsync)
        finally:
            self._flush_gate.release()

    def _begin_flush(self, fsync: bool) -> Callable[[], None] | None:
        self.seal()
        truncations = self._truncations
        # A flush begins: a flush ticket taken before now is covered by it, so appends from
        # now on need a later one (even when no batch was open: the last may have been sealed
        # by an append that filled it).
        self.batch_generation += 1
        written = self.log.next_offset
        if fsync:
            sync = self.log.sync_work()
        else:
            self.log.write_out()
            sync = None
            self._durable_end = written  # in the page cache: all that this policy promises
        synced_upto = written if sync is not None else self._synced_upto
        # A commit that only appended leaves stream.cbor alone (one fdatasync per group commit)
        # until the recovery point would pass a sealed segment (sparing its rescan after a
        # crash).
        sealed_past = (
            sync is not None and self.log.segments[-1].base_offset > self._recovery_written
        )
        if not (self._obsolete or self._offsets_dirty or self._retired or sealed_past):
            if sync is None:
                return None

            def sync_only() -> None:
                sync()
                with self._lock:
                    if self._truncations == truncations:
                        self._synced_upto = max(self._synced_upto, synced_upto)
                        self._durable_end = max(self._durable_end, synced_upto)

            return sync_only
        obsolete, self._obsolete = self._obsolete, []
        state = self.state.encode(synced_upto)
        offsets_dirty, self._offsets_dirty = self._offsets_dirty, False
        retired, self._retired = self._retired, []

        def work() -> None:
            for segment in retired:  # the previous flush, the last that could use them, is over
                segment.close()
            try:
                if sync is not None:
                    sync()
                with self._lock:
                    if self.abandoned:
                        return
                    # A truncation since it began wrote stream.cbor with a lower recovery
                    # point and durable end: this flush's are stale.
                    current = self._truncations == truncations
                    # Synced whenever the policy syncs this flush (not only when records
                    # were): an unsynced checkpoint renamed over the durable one can reach the
                    # disk as the rename without its bytes, and an unreadable stream.cbor loses
                    # every stored offset (a retention-only flush did that).
                    if current:
                        self.env.atomic_write(
                            self.directory / STATE_FILE,
                            state,
                            fsync=fsync or offsets_dirty,
                        )
                        self._recovery_written = max(self._recovery_written, synced_upto)
                        self._synced_upto = max(self._synced_upto, synced_upto)
                        if sync is not None:
                            self._durable_end = max(self._durable_end, synced_upto)
                    if retired:
                        self.env.fsync_dir(self.directory)
                    for segment in obsolete:
                        segment.delete()
                    if obsolete:
                        self.log.segments_deleted()
            except OSError:
                self._obsolete[:0] = obsolete
                self._offsets_dirty = self._offsets_dirty or offsets_dirty
                raise

        return work

    def close(self) -> None:
        work = self.begin_flush()
        if work is not None:
            work()
        for segment in self.log.segments:
            segment.sync()
        self.log.close(clean=True)

    def abandon(self, move_to: Path) -> None:
        with self._lock:
            self.log.move(move_to)  # OSError: nothing changed, the queue stays
            self.abandoned = True

    def close_abandoned(self) -> None:
        for segment in self._retired:
            segment.close()
        self._retired.clear()
        self.log.close(clean=False)
