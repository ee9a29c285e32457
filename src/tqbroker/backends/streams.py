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

Storage knows nothing of AMQP: what a record's compaction key is comes from the broker, as a
function of the message (``CompactionPolicy.key``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from ..model import Message

DEFAULT_TOMBSTONE_GRACE_MS = 24 * 3600 * 1000


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
    def producers(self) -> Mapping[str, int]:
        """Idempotent producers: the next sequence each expects, by producer id."""
        ...

    def append_many(self, messages: Sequence[Message]) -> tuple[int, OSError | None]:
        """Append records, in order (the first gets ``next_offset``): how many were appended,
        and, when storage refused the one after them, why (else None)."""
        ...

    def read(self, offset: int) -> StreamRecord | None:
        """The record at ``offset``; None below the first offset, at the end, where compaction
        removed it, or for a damaged record (logged)."""
        ...

    def read_from(self, offset: int) -> StreamRecord | None:
        """The first record at or after ``offset`` (or the first offset); None when there is
        none yet. Readers go on from the record's offset + 1, stepping over gaps."""
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

    def record_producer(self, producer: str, sequence: int) -> None:
        """Remember the next sequence an idempotent producer's writes expect (durable after the
        next flush, with the records it wrote)."""
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
