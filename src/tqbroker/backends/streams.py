"""The storage contract of stream queues: an append-only log read by offset or time.

A backend that can hold streams implements ``StreamBackend`` besides ``Backend``: the broker
opens every stream (``x-queue-type=stream``) on a backend that has that capability, whatever it
is called. The built-in ``log`` backend (Kafka's segmented log) does.

A ``StreamLog`` is passive like a ``QueueStore``: called from the broker's Trio thread, it never
blocks for long; what blocks (fsync, compaction's copying) is handed to the broker as work to run
in a worker thread. Appends become durable at the backend's next flush (``Backend.begin_flush``),
which moves ``durable_end`` past them; offset commits and producer sequences too. Offsets
increase by one per append and are never reused; retention and compaction only remove records
(reads step over the gaps).

Replication (Kafka's leader and follower): a follower copies the leader's frames verbatim
(``read_frames`` on the leader, ``append_frames`` on the follower: byte-identical frames at the
same offsets), keeps the leader epoch history (``begin_epoch``, ``epoch_history``,
``end_offset_for_epoch``: where a follower's log diverged, KIP-101) and cuts its log back there
(``begin_truncation``: the steps that block run in a worker thread, the cut itself on the
broker's thread; ``truncate`` runs them all in one). Each stream's directory has a
``replica_id``, new whenever the stream is created. Reads are strict: a damaged frame below
the durable end raises ``CorruptLogError`` and fails the stream (``failure``), so a replica
never quietly serves less than it holds.

Storage knows nothing of AMQP: what a record's compaction key is comes from the broker, as a
function of the message (``CompactionPolicy.key``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import attrs

from ..model import Message

DEFAULT_TOMBSTONE_GRACE_MS = 24 * 3600 * 1000
NO_EPOCH = -1  # the leader epoch of a log that never had one (Kafka's UNDEFINED_EPOCH)


class TruncationSteps(NamedTuple):
    """A truncation's steps (``StreamLog.begin_truncation``), run in this order."""

    prepare: Callable[[], None]  # blocking (a worker thread): the intent, durably
    cut: Callable[[], None]  # the broker's thread, quick: the log cut back
    finish: Callable[[], None]  # blocking (a worker thread): the cut made durable


def truncate(log: StreamLog, offset: int) -> None:
    """The whole truncation to ``offset`` in one thread (``StreamLog.begin_truncation``):
    blocking, for a log nothing else uses meanwhile (recovery, tests)."""
    steps = log.begin_truncation(offset)
    if steps is not None:
        steps.prepare()
        steps.cut()
        steps.finish()


class CorruptLogError(OSError):
    """A damaged frame (a failed CRC, a malformed record) where the log holds records, below
    its durable end: the stream is failed (``StreamLog.failure``) and every later read raises
    this too, until the log is emptied (``begin_restart``: a follower copies its leader's
    anew) or the broker restarts. An
    ``OSError`` (``EIO``), so callers that treat storage trouble as retryable keep working;
    it is logged once, with the stream's directory, the segment and the position."""


class OffsetMismatch(ValueError):
    """``append_frames`` was given frames that do not continue the log: the first does not
    start at ``next_offset``, or a frame's offsets are not above the one before (Kafka's
    ``UnexpectedAppendOffsetException``, ``OFFSET_OUT_OF_RANGE`` to a fetcher)."""


class InvalidFrame(ValueError):
    """``append_frames`` was given bytes that are not a valid frame (length, CRC or layout:
    Kafka's ``CORRUPT_MESSAGE``). Nothing of the call was appended."""


class StaleEpoch(ValueError):
    """A leader epoch below the log's current one (Kafka's ``FENCED_LEADER_EPOCH``)."""


@attrs.frozen
class ProducerState:
    """What a partition keeps of an idempotent producer (Kafka's producer state): its epoch
    and the next sequence its writes expect."""

    epoch: int
    next_sequence: int


@attrs.frozen
class CompactionPolicy:
    """Keep only the latest record of each key (Kafka's ``cleanup.policy=compact``).

    ``key`` gives a record's key (None: the record has no key and is always kept). A record with
    an empty body is a tombstone: as the latest record of its key it is kept until
    ``tombstone_grace_ms`` after its timestamp (so that readers see the deletion), then removed
    with the rest (Kafka's ``delete.retention.ms``, one day by default). Two policies are equal
    when their key functions are the same object and their graces equal."""

    key: Callable[[Message], bytes | None]
    tombstone_grace_ms: int = DEFAULT_TOMBSTONE_GRACE_MS


class StreamRecord(Protocol):
    """One record of a stream."""

    @property
    def offset(self) -> int: ...

    @property
    def timestamp_ms(self) -> int:
        """When the broker accepted it (wall-clock milliseconds)."""
        ...

    @property
    def message(self) -> Message: ...

    def parts(self) -> tuple[bytes, bytes, bytes | memoryview]:
        """The message's exchange and routing key as two shortstrs (as ``basic.deliver``
        carries them), its properties as published, and its body: what a delivery copies out
        without building the ``Message``."""
        ...

    @property
    def key_and_value(self) -> tuple[bytes, bytes | memoryview]:
        """The routing key (UTF-8) and the body, without building the ``Message``."""
        ...


class StreamLog(Protocol):
    """The log of one stream (one partition of a partitioned stream)."""

    @property
    def offsets(self) -> Mapping[str, int]:
        """Server-side offset tracking: the next offset each tracked consumer reads, by tag."""
        ...

    @property
    def group_offsets(self) -> Mapping[str, int]:
        """Consumer groups: the committed offset (the next one to read) of each, by name."""
        ...

    @property
    def producers(self) -> Mapping[str, ProducerState]:
        """Idempotent producers: the epoch of each and the next sequence it expects, by
        producer id (a state stored before epochs existed reads as epoch 0)."""
        ...

    def append_many(self, messages: Sequence[Message]) -> tuple[int, OSError | None]:
        """Append records, in order (the first gets ``next_offset``): how many were appended,
        and, when storage refused the one after them, why (else None)."""
        ...

    def read(self, offset: int) -> StreamRecord | None:
        """The record at ``offset``; None below the first offset, at the end, or where
        compaction removed it. Every read raises ``CorruptLogError`` for a damaged frame on its
        way (and once the stream is failed): damage is never stepped over."""
        ...

    def read_from(self, offset: int) -> StreamRecord | None:
        """The first record at or after ``offset`` (or the first offset); None when there is
        none yet. Readers go on from the record's offset + 1, stepping over gaps (compaction's,
        retention's: never damage)."""
        ...

    def read_many(self, offset: int, end: int, limit: int) -> Sequence[StreamRecord]:
        """Up to ``limit`` records from the first at or after ``offset``, all below ``end``,
        in order (what ``read_from`` would give one by one): a reader's bulk read."""
        ...

    def read_frames(
        self, offset: int, end: int, max_bytes: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """The records from ``offset`` on, below ``end`` (at most ``durable_end``), as frames
        in the log's storage format (``docs/storage-format.md``: a record or a record batch,
        each the concatenation of a pair: its 8 bytes of length and CRC, then the rest),
        about ``max_bytes`` of them and at least one frame when there is a record; and the
        offset the next read starts at (``end`` when nothing is left below it). The first
        frame may hold records below ``offset`` and the last records at or past ``end``:
        the reader skips them. A backend that stores the log's format serves its frames as
        they lie (the HTTP topic API's ``TQF1`` body, which the Spark data source reads);
        another encodes its records so (``backends.log.format.encode_batch``)."""
        ...

    def append_frames(self, frames: Sequence[tuple[bytes, bytes]], leader_epoch: int) -> int:
        """Append frames verbatim, at the offsets they carry (a follower copying its leader:
        Kafka's ``appendAsFollower``): exactly what ``read_frames`` of another log returned,
        so the two logs hold byte-identical frames at those offsets; never re-batched. The
        first frame must start at ``next_offset`` and each frame's offsets lie above the one
        before (``OffsetMismatch``); every frame's length, CRC and layout are checked
        (``InvalidFrame``); either refuses the whole call, nothing appended. An open batch of
        local appends is sealed first (a follower has none). ``leader_epoch`` below the
        current one is ``StaleEpoch``; above it, that epoch begins at the first appended
        offset (as ``begin_epoch``, blocking for its checkpoint: the broker begins a new epoch
        with ``begin_epoch`` first, in a worker thread, so this call never blocks). Durable at
        the next flush, like appends (``durable_end`` moves then). Returns the new
        ``next_offset``. An ``OSError`` from storage (a segment to roll to cannot be created)
        leaves the frames before the refused one appended: ``next_offset`` says where the next
        fetch starts."""
        ...

    def begin_truncation(self, offset: int) -> TruncationSteps | None:
        """Begin removing every record at or past ``offset`` (Kafka's ``truncateTo``: a
        follower cuts its log back to where it diverged from the leader); None when the log
        ends at or before it. A frame that holds records on both sides goes whole: the log
        then ends at that frame's first offset. The broker runs the steps in order (see
        ``TruncationSteps``), and meanwhile neither appends to the stream nor begins an epoch;
        reads go on (below the cut: the high watermark is) and flushes wait (``begin_flush``
        returns nothing until the last step ended). After the cut ``next_offset`` and
        ``durable_end`` are at most the new end (nothing past it is read again), the epoch
        history loses the epochs that start at or past it, stored consumer and group offsets
        past it are clamped to it (producer states are kept: the leader's are copied with its
        records). Durable when ``finish`` returns: after a power cut at any point the log is
        the old one or the truncated one, and once it returned never holds a record at or past
        the new end again. A step that raises ``OSError`` ends the truncation unfinished (the
        next start finishes it, or call ``truncate`` again before anything else uses the
        stream)."""
        ...

    def begin_restart(self, offset: int, *, new_identity: bool = False) -> TruncationSteps:
        """Begin removing every record and continuing the log at ``offset`` (Kafka's
        ``truncateFullyAndStartAt``: a follower whose log ends below its leader's log start,
        which retention moved past it, or whose own log is damaged). Run as
        ``begin_truncation``'s steps, and as durable; afterwards ``first_offset``,
        ``next_offset`` and ``durable_end`` are ``offset``, the epoch history is empty and the
        stream is no longer failed (``failure``: its damaged frames are gone). Stored offsets
        and producer states stay; so does the replica id, unless ``new_identity`` (a damaged
        replica copied anew must not be taken for the one that acknowledged records)."""
        ...

    @property
    def leader_epoch(self) -> int:
        """The latest leader epoch in the history (``NO_EPOCH`` if none)."""
        ...

    @property
    def epoch_history(self) -> Sequence[tuple[int, int]]:
        """``(epoch, start_offset)`` of each leader epoch, oldest first: the first offset
        appended in each (Kafka's ``leader-epoch-checkpoint``). Epochs and start offsets
        increase."""
        ...

    def begin_epoch(self, epoch: int) -> None:
        """Begin leader epoch ``epoch`` at ``next_offset`` (a new leader, before it takes
        appends; a follower, before the first frames of a new epoch). The same epoch again is
        nothing; a lower one is ``StaleEpoch``. Blocking (the broker calls it from a worker
        thread, and appends nothing meanwhile): the history is durable before it returns (one
        checkpoint written and fsync'd, as Kafka writes its epoch checkpoint at once), so no
        record of the epoch can reach the disk before the history that names it. Raises
        ``OSError``, nothing changed."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> int:
        """Kafka's ``OffsetsForLeaderEpoch``: the start offset of the first epoch above
        ``epoch``, or ``next_offset`` when there is none. A follower whose last epoch is
        ``epoch`` asks its leader this and truncates its log there (KIP-101)."""
        ...

    @property
    def replica_id(self) -> str:
        """A UUID written when the stream's directory is created: the same across restarts,
        a new one after the stream is deleted and created again (so a controller knows a
        replica whose data was lost or swapped)."""
        ...

    @property
    def failure(self) -> str | None:
        """Why the stream is failed (a damaged frame below its durable end: the
        ``CorruptLogError`` every read raises), else None: the stream's health signal."""
        ...

    @property
    def batch_generation(self) -> int:
        """While it stays the same, every append is made durable by the same flush as the
        appends before it, so one flush ticket (taken after the first of them) serves them
        all. A backend that batches appends moves it when it closes a batch and at every
        ``begin_flush`` (a ticket taken before a flush began is covered by that flush, which
        may not cover later appends); one that writes each append at once may move it on
        every append."""
        ...

    @property
    def first_offset(self) -> int:
        """No record is below it."""
        ...

    @property
    def next_offset(self) -> int:
        """The offset the next append gets."""
        ...

    @property
    def durable_end(self) -> int:
        """Every record below it is as durable as the backend promises (fsync'd, or written to
        the operating system under a policy that does not fsync): the flushed end of the log.
        Readers stop here (the single-node high watermark), so no reader ever sees an offset
        that a crash could give to another record. It only moves forward, at a flush."""
        ...

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose record is not older than ``timestamp_ms`` (``next_offset``
        when there is none)."""
        ...

    def store_offset(self, consumer_tag: str, offset: int) -> None:
        """Remember where a tracked consumer goes on (durable after the next flush)."""
        ...

    def commit_group_offset(self, group: str, offset: int) -> None:
        """Remember a consumer group's committed offset (durable after the next flush)."""
        ...

    def record_producer(self, producer: str, epoch: int, sequence: int) -> None:
        """Remember an idempotent producer's epoch and the next sequence its writes expect
        (durable after the next flush, with the records it wrote)."""
        ...

    def apply_retention(self, *, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Drop the oldest records past retention (whole segments); return how many pieces
        were dropped (removed for good at the next flush)."""
        ...

    def compaction_work(self, policy: CompactionPolicy, now_ms: int) -> Callable[[], Any] | None:
        """Plan a compaction pass: None when there is nothing to do, else the blocking work
        (run in a worker thread; raises ``OSError``) whose result goes to
        ``finish_compaction``. One pass at a time; appends and reads go on meanwhile."""
        ...

    def finish_compaction(self, result: Any) -> int:
        """Install what a pass's work returned (on the Trio thread); return how many records
        it removed."""
        ...


@runtime_checkable
class CompressingLog(Protocol):
    """A ``StreamLog`` that can store its record batches compressed (the built-in log
    backend: a stream's ``x-stream-compression-type``)."""

    def compress_batches(self, codec: int) -> None:
        """Compress the batches appended from now on with ``codec`` (Kafka's ids: 1 gzip, 2
        snappy, 3 lz4, 4 zstd; 0 none); those written before stay as they are."""
        ...


@runtime_checkable
class KafkaBatchLog(Protocol):
    """A ``StreamLog`` that stores a Kafka producer's record batch as it was produced, so that
    a Kafka consumer is sent the stored bytes (the built-in log backend: format 3 frames).
    Other backends take the batch's records as messages (``kafka_batches.messages_of``)."""

    def append_kafka_batch(
        self, exchange: str, batch: bytes, count: int, timestamp_ms: int
    ) -> tuple[int, OSError | None]:
        """Append ``batch`` (record batch v2 bytes as produced, its ``count`` records checked by
        ``kafka_batches.check_records``, the greatest of their timestamps ``timestamp_ms``) at
        ``next_offset``, as one frame, published to ``exchange``: ``count`` appended (0 and the
        ``OSError`` when storage refused it, nothing appended)."""
        ...


@runtime_checkable
class StreamBackend(Protocol):
    """A backend that can hold streams (besides classic queues: it is a ``Backend`` too)."""

    name: str

    def open_stream(
        self, vhost: str, stream: str, *, segment_bytes: int | None = None
    ) -> StreamLog:
        """The log of a stream: created empty if new, recovered if it existed (blocking work:
        the broker calls it from a worker thread). ``Backend.delete_queue`` deletes it.
        ``segment_bytes`` is the stream's ``x-stream-max-segment-size-bytes``, if given."""
        ...
