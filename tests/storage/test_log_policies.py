"""Log retention (per segment, by size and by age) and the fsync policies."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tqbroker.backends import FLUSH_FIRST
from tqbroker.backends.log import LogBackend, parse_fsync_policy
from tqbroker.backends.log.log import Log
from tqbroker.backends.log.segment import Segment
from tqbroker.backends.log.store import LogQueueStore
from tqbroker.model import Message

MESSAGE = Message("", "q", b"\x00\x00", b"x" * 1000)


def filled_log(directory: Path, count: int, *, start_ms: int = 0, step_ms: int = 1) -> Log:
    log = Log(directory, segment_bytes=8 * 1024, index_interval_bytes=512)
    log.open()
    for i in range(count):
        log.append(MESSAGE, 1, timestamp_ms=start_ms + i * step_ms)
    log.write_out()
    return log


def test_size_retention_deletes_whole_oldest_segments_and_keeps_the_active(
    tmp_path: Path,
) -> None:
    log = filled_log(tmp_path, 100)
    sizes = [s.size for s in log.segments]
    assert len(sizes) > 5
    removed = log.segments_past_retention(max_bytes=30 * 1024)
    total_after = sum(s.size for s in log.segments)
    assert removed  # something went
    assert total_after >= 30 * 1024  # never below the limit
    assert total_after - log.segments[0].size < 30 * 1024  # and no more than needed
    for segment in removed:
        segment.delete()
        assert not segment.log_path.exists()
    # The surviving records read back; the deleted ones are gone.
    assert log.reader.read(log.start_offset) is not None
    assert log.reader.read(log.start_offset - 1) is None
    # Even a tiny limit keeps the active segment.
    for segment in log.segments_past_retention(max_bytes=1):
        segment.delete()
    assert len(log.segments) == 1


def test_age_retention_uses_each_segments_newest_timestamp(tmp_path: Path) -> None:
    log = filled_log(tmp_path, 60, start_ms=1_000_000, step_ms=1000)
    now_ms = 1_000_000 + 60 * 1000
    removed = log.segments_past_retention(max_age_ms=30_000, now_ms=now_ms)
    assert removed
    assert all(s.max_timestamp < now_ms - 30_000 for s in removed)
    assert log.segments[0].max_timestamp >= now_ms - 30_000
    assert log.segments_past_retention(max_age_ms=30_000, now_ms=now_ms) == []


def test_age_retention_keeps_a_segment_exactly_max_age_old(tmp_path: Path) -> None:
    """A segment goes once its newest record is OLDER than max-age, not when it is exactly
    max-age old: RabbitMQ streams delete the oldest segment in osiris' ``eval_age`` when
    ``Ts < Now - Age`` (Ts the last timestamp in its index; rabbitmq/osiris
    src/osiris_log.erl, 1.10.3), as Kafka does (``startMs - segment.largestTimestamp >
    retentionMs``, UnifiedLog.deleteRetentionMsBreachedSegments)."""
    max_age_ms, old_ms = 30_000, 1_000_000
    log = Log(tmp_path, segment_bytes=8 * 1024, index_interval_bytes=512)
    log.open()
    for i in range(40):  # a few segments whose every record is old_ms, then newer ones
        log.append(MESSAGE, 1, timestamp_ms=old_ms if i < 20 else old_ms + 60_000)
    log.write_out()
    old = [s for s in log.segments if s.max_timestamp == old_ms]
    assert len(old) >= 2  # 20 records of ~1 kB: two whole segments at least
    assert old == log.segments[: len(old)]
    assert log.segments_past_retention(max_age_ms=max_age_ms, now_ms=old_ms + max_age_ms) == []
    removed = log.segments_past_retention(max_age_ms=max_age_ms, now_ms=old_ms + max_age_ms + 1)
    assert removed == old
    assert log.segments[0].max_timestamp == old_ms + 60_000


@pytest.mark.parametrize(
    ("policy", "seconds"),
    [("batch", 0.0), ("never", None), ("interval:250", 0.25)],
)
def test_fsync_policies_parse(policy: str, seconds: float | None) -> None:
    assert parse_fsync_policy(policy) == seconds


@pytest.mark.parametrize("policy", ["sometimes", "interval:", "interval:-5", "interval:abc"])
def test_bad_fsync_policy_is_refused(policy: str) -> None:
    with pytest.raises(ValueError, match="fsync policy"):
        LogBackend(fsync=policy)


@pytest.mark.parametrize("policy", ["batch", "interval:60000", "never"])
def test_every_policy_keeps_confirmed_messages_across_a_clean_restart(
    tmp_path: Path, policy: str
) -> None:
    backend = LogBackend(fsync=policy)
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    for _ in range(10):
        store.push(MESSAGE, True)
    work = backend.begin_flush()  # confirms may go out once this work (if any) is done
    if work is not None:
        work()
    backend.close()
    backend = LogBackend(fsync=policy)
    backend.open(tmp_path)
    assert backend.open_queue("/", "q").ready_count == 10
    backend.close()


def test_interval_policy_defers_fsync_and_keeps_asking_for_it(tmp_path: Path) -> None:
    backend = LogBackend(fsync="interval:60000")
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    store.push(MESSAGE, True)
    work = backend.begin_flush()  # the first flush of a run is within the interval: no fsync
    if work is not None:
        work()
    # The records are written but not fsync'd: the backend still has deferred work.
    assert backend.needs_flush
    assert any(s.dirty for s in store.log.segments)
    backend.close()


def test_deleting_a_queue_while_its_flush_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush in flight neither fails nor touches the files of the queue redeclared under
    the same name; the new queue keeps exactly its own messages across a restart."""
    real_sync = Segment.sync
    started = threading.Event()

    def slow_sync(self: Segment, *, indexes: bool = True) -> None:
        started.set()
        time.sleep(0.3)
        real_sync(self, indexes=indexes)

    backend = LogBackend()
    backend.open(tmp_path)
    old = backend.open_queue("/", "b")
    for _ in range(5):
        old.push(MESSAGE, True)
    work = backend.begin_flush()
    assert work is not None
    monkeypatch.setattr(Segment, "sync", slow_sync)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(5)
    backend.delete_queue("/", "b")  # while the old queue's fsync is in flight
    new = backend.open_queue("/", "b")
    new.push(Message("", "b", b"\x00\x00", b"new"), True)
    thread.join()
    assert errors == []
    monkeypatch.setattr(Segment, "sync", real_sync)
    second = backend.begin_flush()
    assert second is not None
    second()
    backend.close()
    backend = LogBackend()
    backend.open(tmp_path)
    reopened = backend.open_queue("/", "b")
    assert reopened.ready_count == 1
    popped = reopened.pop()
    assert isinstance(popped, tuple)
    assert popped[1].body == b"new"
    backend.close()


def _drain(store: LogQueueStore, backend: LogBackend) -> list[tuple[int, bytes, bool]]:
    out: list[tuple[int, bytes, bool]] = []
    while True:
        entry = store.pop()
        if entry is FLUSH_FIRST:
            work = backend.begin_flush()
            if work is not None:
                work()
            entry = store.pop()
        if entry is None:
            return out
        assert entry is not FLUSH_FIRST
        out.append((entry[0], entry[1].body, entry[2]))


def test_checkpoint_ahead_of_a_lost_log_tail_never_reuses_offsets(tmp_path: Path) -> None:
    """A power loss may keep the checkpoint but lose the unsynced end of the log: the queue
    must continue after every offset the checkpoint knows, not hand them out again."""
    backend = LogBackend(fsync="never")
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    for _ in range(10):
        store.push(MESSAGE, True)
    for offset, _body, _redelivered in _drain(store, backend):
        store.ack(offset)
    work = backend.begin_flush()
    assert work is not None
    work()
    assert store.head == 10
    segment_path = store.log.segments[-1].log_path
    store.log.close(clean=False)  # crash...
    segment_path.write_bytes(b"")  # ...and the OS never wrote the records back
    backend = LogBackend(fsync="never")
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    assert store.ready_count == 0
    offset = store.push(Message("", "q", b"\x00\x00", b"after"), True)
    assert offset >= 10
    assert [(o, b) for o, b, _r in _drain(store, backend)] == [(offset, b"after")]
    backend.close()


def test_unreadable_checkpoint_recovers_from_the_log_flagging_everything(
    tmp_path: Path,
) -> None:
    backend = LogBackend()
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    for _ in range(3):
        store.push(MESSAGE, True)
    backend.close()
    (store.directory / "state.cbor").write_bytes(b"\xff\x00garbage")
    backend = LogBackend()
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    assert [(o, r) for o, _b, r in _drain(store, backend)] == [(0, True), (1, True), (2, True)]
    backend.close()
