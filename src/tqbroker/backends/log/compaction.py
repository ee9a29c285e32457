"""Compaction of a stream's log (Kafka's ``cleanup.policy=compact``).

Responsibilities:
- ``Compactor`` (the Trio thread): plan a pass (``plan``: nothing to do unless a segment closed
  since the last pass with the same policy, or a tombstone's grace is over) and put the copies
  it wrote in place (``install``, renames only, oldest first); each segment is swapped by one
  atomic rename, so a crash leaves every segment whole in its old or its compacted form, and
  never a dropped tombstone with an older record of its key still on disk;
- ``compact``, a pass's work (a worker thread): find the latest record of every key across the
  segments as the pass planned them, then write, in a scratch directory (``COMPACTION_DIR``), a
  copy of each closed segment that holds records to remove (offsets unchanged, fsync'd);
- ``read_file_records``: a snapshot of a record file (through a descriptor of its own), a
  batch's records as records of their own.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import attrs

from ...storage_env import StorageEnv
from ...storage_env.filecache import Directory
from ..streams import CompactionPolicy
from .format import Batch, Record, RecordError, decode_frame, encode_record
from .segment import Segment

if TYPE_CHECKING:
    from .log import Log  # which opens a log through ``recovery.py``, which imports this

log = logging.getLogger(__name__)

# A compacted copy is written out in chunks of this many bytes.
WRITE_CHUNK = 1024 * 1024
# Where compacted copies of segments are written before they are moved over the originals.
COMPACTION_DIR = "compaction.tmp"


@attrs.frozen
class SegmentSwap:
    """A closed segment and its compacted copy (None: nothing of it is left)."""

    old: Segment
    new: Segment | None
    removed: int  # records of ``old`` that the copy leaves out


@attrs.frozen
class CompactionResult:
    """What a compaction's work wrote, for ``LogStream.finish_compaction``."""

    policy: CompactionPolicy
    planned: tuple[Segment, ...]  # the log's segments when the pass was planned
    swaps: tuple[SegmentSwap, ...]  # oldest first
    compacted_upto: int  # the base offset of the first segment this pass did not compact
    tombstone_due_ms: int | None  # when the first tombstone kept in a closed segment expires


class Source(NamedTuple):
    """A segment as a compaction planned it: its bytes then, and whether it may be rewritten
    (a closed segment with everything written out)."""

    segment: Segment
    path: Path
    size: int
    rewritable: bool


class Compactor:
    """A stream's compaction passes, on the Trio thread: planning one and putting its copies
    in place, and what the last pass did (so the next is planned only when it has work)."""

    def __init__(self, log: Log, directory: Path) -> None:
        self.log = log
        self.directory = directory
        self._policy: CompactionPolicy | None = None
        self._compacted_upto = -1
        self._tombstone_due_ms: int | None = None

    def plan(self, policy: CompactionPolicy, now_ms: int) -> Callable[[], CompactionResult] | None:
        """``LogStream.compaction_work`` for a stream with nothing buffered: None when there
        is nothing to do, else the work (``compact``) over the bytes written out now."""
        segments = self.log.segments
        active = segments[-1]
        if len(segments) < 2:
            return None
        tombstone_due = self._tombstone_due_ms is not None and self._tombstone_due_ms <= now_ms
        if not (
            policy != self._policy or active.base_offset > self._compacted_upto or tombstone_due
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
        env = self.log.env

        def work() -> CompactionResult:
            return compact(env, policy, now_ms, sources, scratch, interval, compacted_upto)

        return work

    def install(self, result: CompactionResult, retired: list[Segment]) -> int:
        """``LogStream.finish_compaction`` for a stream still open: swap the copies in, the
        replaced segments added to ``retired`` (closed by the next flush, which makes the
        renames durable); return how many records they removed. The segments that retention
        took meanwhile are skipped, and their files removed now rather than at the next flush:
        a crash must not bring back records that a copy's dropped tombstone deleted."""
        log = self.log
        present = {id(segment) for segment in log.segments}
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
                log.install(new)
            log.replace_segment(old, new)
            retired.append(old)
            log.changed()
            removed += swap.removed
        with contextlib.suppress(OSError):
            log.env.fs.rmdir(self.directory / COMPACTION_DIR)
        self._policy = result.policy
        self._compacted_upto = result.compacted_upto
        self._tombstone_due_ms = result.tombstone_due_ms
        return removed


def compact(
    env: StorageEnv,
    policy: CompactionPolicy,
    now_ms: int,
    sources: Sequence[Source],
    scratch: Path,
    index_interval_bytes: int,
    compacted_upto: int,
) -> CompactionResult:
    """A compaction's work (worker thread): find the latest record of every key, then write a
    copy, in ``scratch``, of each closed segment that holds records to remove."""
    latest, keyed, damaged, gone = _latest_by_key(env, policy, sources)
    closed = len(sources) - 1
    # A closed segment left as it is (damaged, or not all written out) may hold older records of
    # a key whose tombstone comes later: the tombstones from there on stay, as values do.
    held = next((i for i in range(closed) if i in damaged or not sources[i].rewritable), closed)
    bases = [source.segment.base_offset for source in sources]
    live = [0] * len(sources)  # records each segment keeps
    tombstone_due_ms: int | None = None
    for key, (offset, tombstone_ms) in list(latest.items()):
        i = bisect_right(bases, offset) - 1
        if tombstone_ms is not None:
            due = tombstone_ms + policy.tombstone_grace_ms
            if i >= held:
                latest[key] = (offset, None)
            elif due <= now_ms:
                continue  # removed, with every older record of its key
            else:
                tombstone_due_ms = due if tombstone_due_ms is None else min(tombstone_due_ms, due)
        live[i] += 1
    rewrite = [
        source
        for i, source in enumerate(sources[:closed])
        if source.rewritable and i not in damaged and i not in gone and live[i] < keyed[i]
    ]
    swaps: list[SegmentSwap] = []
    try:
        if rewrite:
            env.fs.rmtree(scratch)  # an earlier pass's leftovers
            env.fs.mkdir(scratch)
        for source in rewrite:
            swap = _rewrite(env, policy, now_ms, source, latest, scratch, index_interval_bytes)
            if swap is not None:
                swaps.append(swap)
        if swaps:
            env.fsync_dir(scratch)
    except BaseException:
        for swap in swaps:
            if swap.new is not None:
                swap.new.delete()
        raise
    planned = tuple(source.segment for source in sources)
    return CompactionResult(policy, planned, tuple(swaps), compacted_upto, tombstone_due_ms)


# A key's latest record: its offset, and its timestamp if it is a tombstone (else None).
_Latest = dict[bytes, tuple[int, int | None]]


def _latest_by_key(
    env: StorageEnv, policy: CompactionPolicy, sources: Sequence[Source]
) -> tuple[_Latest, list[int], set[int], set[int]]:
    """The latest record of every key; how many keyed records each segment has; the segments
    that are damaged (read up to the damage, left as they are) and those gone (retention
    deleted them meanwhile). Each file is fsync'd first."""
    latest: _Latest = {}
    keyed = [0] * len(sources)
    damaged: set[int] = set()
    gone: set[int] = set()
    for i, source in enumerate(sources):
        try:
            fs = env.fs
            fd = fs.open(source.path, os.O_RDONLY)
            try:
                fs.fdatasync(fd)
            finally:
                fs.close(fd)
            for record, _raw in read_file_records(source.path, source.size):
                key = policy.key(record.message)
                if key is not None:
                    keyed[i] += 1
                    tombstone_ms = None if record.message.body else record.timestamp_ms
                    latest[key] = (record.offset, tombstone_ms)
        except FileNotFoundError:
            gone.add(i)
        except RecordError as exc:
            log.warning("%s: not compacted: %s", source.path, exc)
            damaged.add(i)
    return latest, keyed, damaged, gone


def _rewrite(
    env: StorageEnv,
    policy: CompactionPolicy,
    now_ms: int,
    source: Source,
    latest: _Latest,
    scratch: Path,
    index_interval_bytes: int,
) -> SegmentSwap | None:
    """Copy the records of ``source`` that are the latest of their key (or have none) to a new
    segment in ``scratch``, fsync'd; None if the source went away meanwhile (retention). Raises
    OSError if it no longer reads as it did a moment ago."""
    out = Segment(env.files, Directory(scratch), source.segment.base_offset, index_interval_bytes)
    removed = 0
    try:
        for record, raw in read_file_records(source.path, source.size):
            key = policy.key(record.message)
            entry = latest.get(key) if key is not None else None
            if entry is not None and (
                entry[0] != record.offset
                or (entry[1] is not None and entry[1] + policy.tombstone_grace_ms <= now_ms)
            ):
                removed += 1
                continue
            out.append(record.offset, record.timestamp_ms, raw)
            if out.pending >= WRITE_CHUNK:
                out.write_out()
        out.write_out()
        out.sync()
        out.dirty = out.index_dirty = False  # private to this thread until installed: synced
    except FileNotFoundError:
        out.delete()
        return None
    except RecordError as exc:
        out.delete()
        raise OSError(f"{source.path} changed while it was compacted: {exc}") from exc
    except BaseException:
        out.delete()
        raise
    if not out.size:
        out.delete()
        return SegmentSwap(source.segment, None, removed)
    return SegmentSwap(source.segment, out, removed)


def read_file_records(path: Path, size: int) -> Iterator[tuple[Record, bytes]]:
    """The records in the first ``size`` bytes of the record file at ``path``, each with its
    bytes as a single record (a batch's records are encoded as records of their own), in
    order: a snapshot read by a worker thread through a descriptor of its own (the file may be
    appended to meanwhile, or unlinked). Raises ``RecordError`` at the first damaged frame (or
    one whose offsets are not above the one before), OSError if the file is gone."""
    if size == 0:
        return
    with (
        open(path, "rb") as file,
        mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as mapped,
        memoryview(mapped) as view,
    ):
        pos, least = 0, 0
        while pos < size:
            frame = decode_frame(view, pos)
            if frame is None:
                raise RecordError(f"record at {path}:{pos} is cut short")
            if frame.offset < least:
                raise RecordError(f"offset {frame.offset} at {path}:{pos}, {least} or more due")
            if isinstance(frame, Batch):
                for record in frame.records:
                    raw = encode_record(
                        record.offset, record.timestamp_ms, record.flags, record.message
                    )
                    yield record, raw
            else:
                yield frame, bytes(view[pos : pos + frame.size])
            pos += frame.size
            least = frame.last_offset + 1
