"""What one group commit of the ``log`` backend costs on disk, and that the cheaper commit keeps
recovery exact: a commit that only appended fdatasyncs the active segment's record file alone
(no index, no checkpoint rewrite); a sealed segment is synced with its indexes and the
checkpoint written once before the recovery point passes it; a new segment's directory entry is
made durable before its records are confirmed. Queues and streams alike."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.log import Log
from tqbroker.backends.log.store import LogQueueStore
from tqbroker.backends.log.stream import LogStream
from tqbroker.model import Message
from tqbroker.storage_env import StorageEnv

PERSISTENT = b"\x10\x00\x02"  # flags: delivery-mode present; delivery-mode 2


def message(n: int) -> Message:
    return Message("", "q", PERSISTENT, b"%06d" % n + b"." * 200, timestamp_ms=1_700_000_000_000)


class Syscalls:
    """Counts the durability calls made while flushing."""

    def __init__(self) -> None:
        self.fdatasync: list[str] = []  # file names
        self.fsync_dir: list[Path] = []
        self.replaced: list[str] = []


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> Syscalls:
    seen = Syscalls()
    real_fdatasync, real_replace = os.fdatasync, os.replace

    def fdatasync(fd: int) -> None:
        seen.fdatasync.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fdatasync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        seen.replaced.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(StorageEnv, "fsync_dir", lambda _env, path: seen.fsync_dir.append(path))
    monkeypatch.setattr(os, "replace", replace)
    return seen


def flush(backend: LogBackend, seen: Syscalls | None = None) -> list[str]:
    """One group commit; the names of the files it fdatasynced."""
    if seen is not None:
        seen.fdatasync.clear()
        seen.fsync_dir.clear()
        seen.replaced.clear()
    work = backend.begin_flush()
    if work is not None:
        work()
    return [] if seen is None else list(seen.fdatasync)


Opener = Callable[[LogBackend], object]


def open_queue(backend: LogBackend) -> object:
    return backend.open_queue("/", "q")


def open_stream(backend: LogBackend) -> object:
    return backend.open_stream("/", "q")


def append(store: object, n: int) -> None:
    if isinstance(store, LogQueueStore):
        store.push(message(n), persistent=True)
    else:
        assert isinstance(store, LogStream)
        store.append(message(n))
        store.seal()  # a record batch of one: into the log now, as a queue's push goes


def segment_log(store: object) -> Log:
    log = store.log  # type: ignore[attr-defined]
    assert isinstance(log, Log)
    return log


@pytest.mark.parametrize("opener", [open_queue, open_stream], ids=["queue", "stream"])
def test_an_append_only_commit_syncs_the_record_file_alone(
    tmp_path: Path, syscalls: Syscalls, opener: Opener
) -> None:
    backend = LogBackend(segment_bytes=64 * 1024)
    backend.open(tmp_path)
    store = opener(backend)
    append(store, 0)
    flush(backend)  # the first commit makes the new segment's directory entry durable
    for n in range(1, 20):
        append(store, n)
    assert flush(backend, syscalls) == ["00000000000000000000.log"]
    assert syscalls.fsync_dir == []
    assert syscalls.replaced == [], "the checkpoint was rewritten by an append-only commit"
    backend.close()


@pytest.mark.parametrize("opener", [open_queue, open_stream], ids=["queue", "stream"])
def test_a_sealed_segment_gets_its_indexes_synced_and_the_checkpoint_passes_it(
    tmp_path: Path, syscalls: Syscalls, opener: Opener
) -> None:
    backend = LogBackend(segment_bytes=8 * 1024, index_interval_bytes=1024)
    backend.open(tmp_path)
    store = opener(backend)
    log = segment_log(store)
    n = 0
    while len(log.segments) == 1:
        append(store, n)
        n += 1
        if n % 5 == 0:
            flush(backend)
    sealed, active = log.segments
    append(store, n)
    synced = flush(backend, syscalls)
    base = f"{sealed.base_offset:020d}"
    # The sealed segment: its indexes (and its record file if it had unwritten records).
    assert {f"{base}.index", f"{base}.timeindex"} <= set(synced)
    assert f"{active.base_offset:020d}.log" in synced
    assert f"{active.base_offset:020d}.index" not in synced
    assert syscalls.fsync_dir == [log.directory]  # the new segment's entries
    assert len(syscalls.replaced) == 1  # the checkpoint, whose recovery point passes it
    # Afterwards the active segment's commits are back to one fdatasync.
    append(store, n + 1)
    assert flush(backend, syscalls) == [f"{active.base_offset:020d}.log"]
    assert syscalls.replaced == []
    backend.close()


def crash(backend: LogBackend) -> None:
    """Stop without ``close``: what was written out stays, buffers are lost."""
    for store in backend._stores():
        store.log.close(clean=False)


@pytest.mark.parametrize("opener", [open_queue, open_stream], ids=["queue", "stream"])
def test_a_crash_after_append_only_commits_recovers_every_committed_record(
    tmp_path: Path, opener: Opener
) -> None:
    """Many segments sealed by append-only commits, the active segment's index files wiped
    (their pages were never synced), a crash: every committed record is read back, in order,
    and appending continues after the last."""
    backend = LogBackend(segment_bytes=4 * 1024, index_interval_bytes=512)
    backend.open(tmp_path)
    store = opener(backend)
    for n in range(300):
        append(store, n)
        if n % 7 == 6:
            flush(backend)
    flush(backend)
    log = segment_log(store)
    assert len(log.segments) > 5
    active = log.segments[-1]
    crash(backend)
    for path in (active.offset_index.path, active.time_index.path):
        path.write_bytes(b"\x00" * 24)  # lost pages read back as zeros
    backend = LogBackend(segment_bytes=4 * 1024, index_interval_bytes=512)
    backend.open(tmp_path)
    store = opener(backend)
    log = segment_log(store)
    bodies = [record.message.body[:6] for record in log.reader.records(0)]
    assert bodies == [b"%06d" % n for n in range(300)]
    assert log.next_offset == 300
    for n in range(300):
        record = log.reader.read(n)
        assert record is not None
        assert record.message.body[:6] == b"%06d" % n
    assert log.reader.offset_for_timestamp(1_700_000_000_000) == 0
    append(store, 300)
    flush(backend)
    backend.close()


def test_a_segment_ending_at_the_recovery_point_is_rescanned_not_trusted(tmp_path: Path) -> None:
    """A checkpoint written while a segment was still active (an offset stored) has its end as
    recovery point; the next append rolls exactly there. The segment's indexes were not synced
    yet, so after a crash before the next commit they cannot be trusted: a time index that lost
    its tail must not hide the segment's newest timestamp."""
    t0 = 1_700_000_000_000
    backend = LogBackend(segment_bytes=16 * 240, index_interval_bytes=400)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    log = segment_log(stream)
    n = 0
    while log.segments[-1].size + 250 <= 16 * 240:
        stamp = t0 + (20_000 if n == 5 else n * 1000)  # the clock stepped back after offset 5
        stream.append(Message("", "s", PERSISTENT, b"%06d" % n + b"." * 200, timestamp_ms=stamp))
        stream.seal()
        n += 1
    stream.store_offset("c", 1)  # makes the checkpoint necessary
    flush(backend)
    append(stream, n)  # rolls at the recovery point
    assert [s.base_offset for s in log.segments] == [0, n]
    first = log.segments[0]
    assert first.max_timestamp == t0 + 20_000
    crash(backend)
    with open(first.time_index.path, "r+b") as f:
        f.truncate(12)  # the unsynced time index kept only its first entry
    backend = LogBackend(segment_bytes=16 * 240, index_interval_bytes=400)
    backend.open(tmp_path)
    log = segment_log(backend.open_stream("/", "s"))
    assert log.segments[0].max_timestamp == t0 + 20_000
    assert log.reader.offset_for_timestamp(t0 + 20_000) == 5
    backend.close()


@pytest.mark.parametrize(("policy", "moves_at_begin"), [("batch", False), ("never", True)])
def test_a_streams_durable_end_moves_only_when_its_records_are_durable(
    tmp_path: Path, policy: str, moves_at_begin: bool
) -> None:
    """Readers stop at ``durable_end``: it passes a record once the flush made the record as
    durable as the policy promises (fsync'd; written out under ``never``), never before."""
    backend = LogBackend(segment_bytes=64 * 1024, fsync=policy)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    assert isinstance(stream, LogStream)
    for n in range(3):
        stream.append(message(n))
    assert (stream.next_offset, stream.durable_end) == (3, 0)
    work = backend.begin_flush()
    assert stream.durable_end == (3 if moves_at_begin else 0)
    if work is not None:
        work()
    assert stream.durable_end == 3
    stream.append(message(3))
    assert stream.durable_end == 3
    backend.close()
    reopened = LogBackend(segment_bytes=64 * 1024, fsync=policy)
    reopened.open(tmp_path)
    assert reopened.open_stream("/", "s").durable_end == 4  # what recovery found is on disk
    reopened.close()


def test_a_failed_fsync_leaves_a_streams_durable_end_where_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LogBackend(segment_bytes=64 * 1024)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    stream.append(message(0))
    flush(backend)

    def failing(fd: int) -> None:
        raise OSError(5, "injected I/O error")

    monkeypatch.setattr(os, "fdatasync", failing)
    stream.append(message(1))
    with pytest.raises(OSError, match="injected"):
        flush(backend)
    assert (stream.durable_end, stream.next_offset) == (1, 2)
