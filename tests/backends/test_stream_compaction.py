"""Stream compaction (``LogStream.compaction_work`` / ``finish_compaction``) on real files: a
state machine against a model (appends with keys, tombstones and timestamps out of order, rolls,
compactions with appends and retention between plan and swap, reopen clean or after a crash);
when a pass is due; tombstones' grace; the record cache; a crash at every step of the swap (the
directory copied before each rename and unlink); processes killed with SIGKILL while they
compact; readers and writers on the Trio thread while the work runs in a thread."""

from __future__ import annotations

import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tqbroker.backends.log.cache import RecordCache
from tqbroker.backends.log.compaction import COMPACTION_DIR
from tqbroker.backends.log.format import Record
from tqbroker.backends.log.log import Log
from tqbroker.backends.log.stream import LogStream
from tqbroker.backends.streams import CompactionPolicy, CorruptLogError
from tqbroker.broker.streams.compaction import compaction_policy
from tqbroker.model import Message
from tqbroker.protocol.codec import FieldTable, FieldValue
from tqbroker.protocol.methods import BasicProperties

T0 = 1_700_000_000_000
GRACE = 1_000
POLICY = compaction_policy(key_header="key", tombstone_grace_ms=GRACE)

# What the model knows of a record: its key (None: no key header), body and timestamp.
Entry = tuple[str | None, bytes, int]


def message(key: str | None, body: bytes, timestamp_ms: int) -> Message:
    headers: FieldTable | None = {"key": key} if key is not None else None
    raw = BasicProperties(headers=headers).encode()
    return Message("ex", "rk", raw, body, timestamp_ms=timestamp_ms)


def entry(record: Record) -> Entry:
    headers = record.message.properties.headers or {}
    key = headers.get("key")
    assert key is None or isinstance(key, str)
    return key, record.message.body, record.timestamp_ms


def append(stream: LogStream, record: Message) -> int:
    """Append ``record`` as a record batch of its own (into the log at once, where these tests
    look at segments): the state machine below appends real batches."""
    offset = stream.append(record)
    stream.seal()
    return offset


def open_stream(directory: Path, *, segment_bytes: int = 400, cache_bytes: int = 0) -> LogStream:
    log = Log(
        directory,
        segment_bytes=segment_bytes,
        index_interval_bytes=64,
        cache=RecordCache(cache_bytes),
    )
    stream = LogStream(directory, log)
    stream.open()
    return stream


def flush(stream: LogStream, *, fsync: bool = True) -> None:
    work = stream.begin_flush(fsync=fsync)
    if work is not None:
        work()


def crash(stream: LogStream) -> None:
    """Stop without a clean close: buffered records are lost, written ones stay."""
    stream.close_abandoned()


def compact(stream: LogStream, policy: CompactionPolicy, now_ms: int) -> int | None:
    work = stream.compaction_work(policy, now_ms)
    if work is None:
        return None
    return stream.finish_compaction(work())


def surviving(stream: LogStream) -> dict[int, Entry]:
    """Every record, read as a consumer does: ``read_from`` the last offset + 1."""
    found: dict[int, Entry] = {}
    offset = stream.first_offset
    while (record := stream.read_from(offset)) is not None:
        assert record.offset >= offset
        found[record.offset] = entry(record)
        offset = record.offset + 1
    return found


def removed_by(
    model: dict[int, Entry], closed_below: int, policy_grace_ms: int, now_ms: int
) -> set[int]:
    """What a compaction planned now removes: in the closed segments, every keyed record that is
    not the latest of its key, and the latest when it is a tombstone past its grace."""
    latest: dict[str, int] = {}
    for offset in sorted(model):
        key = model[offset][0]
        if key is not None:
            latest[key] = offset
    removed = set()
    for offset, (key, body, timestamp_ms) in model.items():
        if key is None or offset >= closed_below:
            continue
        expired = not body and timestamp_ms + policy_grace_ms <= now_ms
        if latest[key] != offset or expired:
            removed.add(offset)
    return removed


# -- the model ---------------------------------------------------------------------------------


class CompactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="compaction-"))
        self.stream = open_stream(self.directory)
        self.model: dict[int, Entry] = {}
        self.now = T0

    def teardown(self) -> None:
        self.stream.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _append(self, key: str | None, tombstone: bool, skew: int, size: int) -> None:
        self.now += 10
        timestamp_ms = self.now + skew
        body = b"" if tombstone else b"v%d." % self.stream.next_offset + b"x" * size
        offset = self.stream.append(message(key, body, timestamp_ms))
        self.model[offset] = (key, body, timestamp_ms)

    @rule(
        records=st.lists(
            st.tuples(
                st.sampled_from(["a", "a", "b", "c", "d", None]),
                st.booleans(),  # a tombstone
                st.integers(-300, 300),  # timestamp skew
                st.integers(0, 80),  # body size
            ),
            min_size=1,
            max_size=8,
        )
    )
    def append(self, records: list[tuple[str | None, bool, int, int]]) -> None:
        for key, tombstone, skew, size in records:
            self._append(key, tombstone, skew, size)
        self.stream.seal()  # one record batch

    @rule(
        wait=st.sampled_from([0, 10, GRACE // 2, GRACE, 3 * GRACE]),
        appends=st.integers(0, 6),
        retention_bytes=st.none() | st.integers(300, 3000),
    )
    def compact(self, wait: int, appends: int, retention_bytes: int | None) -> None:
        """Plan, then append and apply retention while the work "runs", then swap."""
        self.now += wait
        now = self.now
        self.stream.seal()  # the open record batch into the log, as compaction_work does
        active_base = self.stream.log.segments[-1].base_offset
        work = self.stream.compaction_work(POLICY, now)
        if work is None:
            return
        removed = removed_by(self.model, active_base, GRACE, now)
        for n in range(appends):
            self._append("a" if n % 2 else None, False, 0, 50)
        if retention_bytes is not None:
            self.retention(retention_bytes)
        result = work()
        assert self.stream.finish_compaction(result) == len(removed & self.model.keys())
        for offset in removed:
            self.model.pop(offset, None)
        self.stream.seal()
        if self.stream.log.segments[-1].base_offset == active_base:  # no roll meanwhile
            assert self.stream.compaction_work(POLICY, now) is None

    @rule(max_bytes=st.integers(300, 3000))
    def retention(self, max_bytes: int) -> None:
        self.stream.apply_retention(max_bytes=max_bytes, max_age_ms=None, now_ms=self.now)
        first = self.stream.first_offset
        self.model = {offset: e for offset, e in self.model.items() if offset >= first}

    @rule()
    def flush(self) -> None:
        flush(self.stream)

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        if clean:
            self.stream.close()
        else:
            # Retention's deletions done, but the recovery point not moved: the segments
            # compaction rewrote since the last fsync'd flush are scanned again.
            flush(self.stream, fsync=False)
            crash(self.stream)
        self.stream = open_stream(self.directory)

    @invariant()
    def reads_agree_with_the_model(self) -> None:
        stream = self.stream
        assert surviving(stream) == self.model
        first, end = stream.first_offset, stream.next_offset
        assert all(first <= offset < end for offset in self.model)
        offsets = sorted(self.model)
        for offset in range(first, end + 1):
            record = stream.read(offset)
            assert (entry(record) if record else None) == self.model.get(offset)
            after = [o for o in offsets if o >= offset]
            record = stream.read_from(offset)
            assert (record.offset if record else None) == (after[0] if after else None)
        for timestamp_ms in {T0, self.now - 500, self.now, *(e[2] for e in self.model.values())}:
            at_or_after = [o for o in offsets if self.model[o][2] >= timestamp_ms]
            expected = at_or_after[0] if at_or_after else end
            assert stream.offset_for_timestamp(timestamp_ms) == max(expected, first)


CompactionMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_compaction_agrees_with_the_model = CompactionMachine.TestCase


def test_the_latest_record_of_each_key_stays_at_its_offset(tmp_path: Path) -> None:
    """What the model checks, spelled out on one history."""
    stream = open_stream(tmp_path)
    history = [("a", b"1"), ("b", b"1"), (None, b"x"), ("a", b"2"), ("b", b""), ("a", b"3")]
    offsets: dict[int, tuple[str | None, bytes]] = {}
    for n in range(30):
        key, body = history[n % len(history)]
        offsets[append(stream, message(key, body, T0 + n))] = (key, body)
    assert len(stream.log.segments) > 3
    active_base = stream.log.segments[-1].base_offset
    removed = compact(stream, compaction_policy("key", tombstone_grace_ms=10**9), T0 + 30)
    found = surviving(stream)
    assert removed == len(offsets) - len(found)
    assert removed > 0
    latest = {key: o for o, (key, _body) in offsets.items() if key is not None}
    for offset, (key, _body) in offsets.items():
        if key is None or offset >= active_base or latest[key] == offset:
            assert stream.read(offset) is not None, offset  # kept at its original offset
        else:
            assert stream.read(offset) is None, offset
            assert offset not in found
    stream.close()


# -- when a pass is due ------------------------------------------------------------------------


def test_a_pass_is_due_when_a_segment_closed_or_the_policy_changed(tmp_path: Path) -> None:
    stream = open_stream(tmp_path, segment_bytes=2000)

    def append_until_a_roll() -> None:
        active = stream.log.segments[-1]
        n = 0
        while stream.log.segments[-1] is active:
            append(stream, message("a" if n % 2 else None, b"x" * 50, T0))
            n += 1

    assert stream.compaction_work(POLICY, T0) is None  # only the active segment
    append_until_a_roll()
    append_until_a_roll()
    assert compact(stream, POLICY, T0)
    assert stream.compaction_work(POLICY, T0) is None
    append(stream, message("a", b"x" * 50, T0))  # no roll: the active segment grows
    assert stream.compaction_work(POLICY, T0) is None
    assert stream.compaction_work(compaction_policy(key_header="other"), T0) is not None
    append_until_a_roll()
    assert compact(stream, POLICY, T0)
    stream.close()
    # After a restart the first pass goes over everything again (finding nothing here).
    stream = open_stream(tmp_path)
    assert compact(stream, POLICY, T0) == 0
    assert compact(stream, POLICY, T0) is None
    stream.close()


def test_tombstones_stay_until_their_grace_is_over(tmp_path: Path) -> None:
    stream = open_stream(tmp_path)
    old = append(stream, message("a", b"old value", T0))
    other = append(stream, message("b", b"other", T0))
    tombstone = append(stream, message("a", b"", T0 + 100))
    while len(stream.log.segments) < 2:
        append(stream, message(None, b"x" * 50, T0 + 200))
    assert compact(stream, POLICY, T0 + 100 + GRACE - 1) == 1  # the old value only
    assert stream.read(old) is None
    assert stream.read(tombstone) is not None  # readers still see the deletion
    # Nothing closed since; the tombstone's grace is over only at T0 + 100 + GRACE.
    assert stream.compaction_work(POLICY, T0 + 100 + GRACE - 1) is None
    assert compact(stream, POLICY, T0 + 100 + GRACE) == 1
    assert stream.read(tombstone) is None
    assert stream.read(other) is not None
    assert stream.compaction_work(POLICY, T0 + 10 * GRACE) is None
    # A tombstone in the active segment stays, however old: only closed segments are rewritten.
    late = append(stream, message("b", b"", T0))
    assert compact(stream, compaction_policy("key", tombstone_grace_ms=0), T0 + 10 * GRACE) == 1
    assert stream.read(other) is None
    assert stream.read(late) is not None
    stream.close()


def test_keys_by_routing_key_or_header(tmp_path: Path) -> None:
    stream = open_stream(tmp_path)

    def add(routing_key: str, header: FieldValue) -> int:
        raw = BasicProperties(headers={"id": header} if header is not None else None).encode()
        return append(stream, Message("ex", routing_key, raw, b"body", timestamp_ms=T0))

    by_bytes = add("k1", b"7")
    by_text = add("k2", "7")  # the same key as b"7"
    by_int = add("k1", 7)  # no key: an int
    no_header = add("k2", None)
    while len(stream.log.segments) < 2:
        add("k3", None)
    assert compact(stream, compaction_policy(key_header="id"), T0) == 1
    assert stream.read(by_bytes) is None
    assert [stream.read(o) is not None for o in (by_text, by_int, no_header)] == [True] * 3
    # By routing key: the latest of k1 (by_int) and of k2 (no_header) stay, by_text goes.
    assert compact(stream, compaction_policy(), T0)
    assert stream.read(by_text) is None
    assert stream.read(by_int) is not None
    assert stream.read(no_header) is not None
    stream.close()


# -- the record cache and damaged records ------------------------------------------------------


def damage(stream: LogStream, offset: int) -> None:
    """Flip the last byte of the (written out) record at ``offset``: its CRC fails."""
    record = stream.read(offset)
    assert record is not None
    segment = next(s for s in reversed(stream.log.segments) if s.base_offset <= offset)
    position = next(
        pos
        for pos in range(segment.written)
        if segment.file.pread(8, pos + 8) == offset.to_bytes(8, "big")
    )
    segment.file.pwrite(b"\xff", position + record.size - 1)
    segment._read_pos = -1  # forget the read-ahead


def test_the_record_cache_never_serves_a_removed_record(tmp_path: Path) -> None:
    stream = open_stream(tmp_path, cache_bytes=1 << 20)
    offsets = [append(stream, message("a", b"v%d" % n, T0)) for n in range(40)]
    assert all(stream.log._cached.find(offset) is not None for offset in offsets)  # all hot
    assert len(stream.log.segments) > 1
    active_base = stream.log.segments[-1].base_offset
    assert compact(stream, POLICY, T0)
    for offset in offsets:
        record = stream.read(offset)
        assert (record is not None) == (offset >= active_base)
    first = stream.read_from(0)
    assert first is not None
    assert first.offset == active_base
    stream.close()


def test_a_damaged_record_in_a_compacted_segment_fails_the_stream(tmp_path: Path) -> None:
    """Strict reads: damage is never stepped over, not even in a compacted segment (whose gaps
    are not damage: every record around them reads)."""
    stream = open_stream(tmp_path, segment_bytes=4000)
    for n in range(200):
        append(stream, message(f"k{n % 40}" if n % 3 else None, b"v%d" % n + b"." * 20, T0))
    assert compact(stream, POLICY, T0)
    stream.close()
    stream = open_stream(tmp_path)
    before = surviving(stream)
    segment = stream.log.segments[0]
    here = [o for o in before if o < segment.next_offset]
    assert len(here) > 5
    victim = here[len(here) // 2]
    damage(stream, victim)
    with pytest.raises(CorruptLogError):
        surviving(stream)
    assert stream.failure is not None
    assert segment.log_path.name in stream.failure
    with pytest.raises(CorruptLogError):
        stream.read(here[0])  # the stream is failed: no read is served
    stream.close()


def test_a_tombstone_stays_while_an_older_segment_cannot_be_compacted(tmp_path: Path) -> None:
    """A damaged segment is left as it is, older records of a key included: that key's later
    tombstone must stay, or the older record would come back as the latest."""
    stream = open_stream(tmp_path, segment_bytes=600)
    old = append(stream, message("k", b"old", T0))
    damaged = append(stream, message(None, b"d" * 30, T0))
    while len(stream.log.segments) == 1:
        append(stream, message("other", b"x" * 30, T0))
    tombstone = append(stream, message("k", b"", T0))
    while len(stream.log.segments) == 2:
        append(stream, message(None, b"y" * 30, T0))
    flush(stream)
    first = stream.log.segments[0]
    damage(stream, damaged)
    assert compact(stream, compaction_policy("key", tombstone_grace_ms=0), T0 + 10) is not None
    assert stream.log.segments[0] is first  # not rewritten
    assert stream.read(old) is not None
    assert stream.read(tombstone) is not None  # still the latest of "k"
    stream.close()


# -- retention meanwhile -----------------------------------------------------------------------


def test_a_segment_retention_takes_meanwhile_is_skipped_and_deleted_at_once(
    tmp_path: Path,
) -> None:
    stream = open_stream(tmp_path)
    old = append(stream, message("a", b"old", T0))
    for n in range(30):
        append(stream, message(f"k{n % 3}", b"x" * 40, T0))
    tombstone = append(stream, message("a", b"", T0))
    while stream.log.segments[-1].base_offset <= tombstone:
        append(stream, message(None, b"y" * 40, T0))
    flush(stream)
    first = stream.log.segments[0]
    work = stream.compaction_work(compaction_policy("key", tombstone_grace_ms=0), T0)
    assert work is not None
    result = work()
    total = sum(segment.size for segment in stream.log.segments)
    assert stream.apply_retention(max_bytes=total - first.size, max_age_ms=None, now_ms=T0) == 1
    assert first not in stream.log.segments
    assert tombstone >= stream.first_offset
    stream.finish_compaction(result)
    assert stream.read(tombstone) is None  # dropped, its grace being over
    # The segment holding the old value is gone from the disk already: a crash now cannot bring
    # it back next to a compacted segment that dropped the key's tombstone.
    assert not first.log_path.exists()
    crash(stream)
    stream = open_stream(tmp_path)
    assert stream.read(old) is None
    assert all(e[0] != "a" for e in surviving(stream).values())
    stream.close()


# -- crashes -----------------------------------------------------------------------------------


def build(directory: Path) -> tuple[LogStream, dict[int, Entry]]:
    """Keyed records, unkeyed ones and tombstones over many segments, all written out: the first
    segments hold only records of a key deleted (by an old tombstone) further on."""
    stream = open_stream(directory, segment_bytes=600)
    model: dict[int, Entry] = {}

    def add(key: str | None, body: bytes, timestamp_ms: int) -> None:
        model[append(stream, message(key, body, timestamp_ms))] = (key, body, timestamp_ms)

    for n in range(20):
        add("early", b"e%d" % n, T0 + n)
    for n in range(120):
        key = None if n % 7 == 0 else f"k{n % 5}"
        add(key, b"" if n % 11 == 0 else b"v%d" % n + b"." * (n % 30), T0 + n)
    add("early", b"", T0)
    for n in range(30):
        add(None, b"u%d" % n, T0 + 200)
    flush(stream)
    return stream, model


def check_consistent(
    found: dict[int, Entry],
    model: dict[int, Entry],
    bounds: list[tuple[int, int]],
    removed: set[int],
) -> None:
    """Every segment range ``[start, end)`` holds its old records or its compacted ones; no
    record differs from what was appended; no key's older record outlives a dropped tombstone."""
    for offset, e in found.items():
        assert model[offset] == e
    for start, end in bounds:
        old = {o for o in model if start <= o < end}
        here = {o for o in found if start <= o < end}
        assert here in (old, old - removed), (start, end)
    latest: dict[str, int] = {}
    for offset in sorted(model):
        key = model[offset][0]
        if key is not None:
            latest[key] = offset
    for key, offset in latest.items():
        kept = [o for o in found if found[o][0] == key]
        tombstone = not model[offset][1]
        assert (max(kept) if kept else None) in ((offset, None) if tombstone else (offset,)), key


def test_a_crash_at_every_step_of_the_swap_leaves_old_or_compacted_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = tmp_path / "live"
    stream, model = build(live)
    segments = stream.log.segments
    bounds = [(a.base_offset, b.base_offset) for a, b in pairwise(segments)]
    policy = compaction_policy("key", tombstone_grace_ms=50)
    now = T0 + 100  # the early tombstones are past their grace, the late ones not
    removed = removed_by(model, segments[-1].base_offset, 50, now)
    work = stream.compaction_work(policy, now)
    assert work is not None
    result = work()
    snapshots: list[Path] = []

    def snapshot() -> None:
        target = tmp_path / f"snapshot-{len(snapshots)}"
        shutil.copytree(live, target)
        snapshots.append(target)

    def before(real: Callable[..., None]) -> Callable[..., None]:
        def call(*args: object, **kwargs: object) -> None:
            snapshot()
            real(*args, **kwargs)

        return call

    snapshot()  # the work done, nothing swapped
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", before(os.replace))
        patch.setattr(os, "unlink", before(os.unlink))
        assert stream.finish_compaction(result) == len(removed)
    snapshot()
    flush(stream)
    snapshot()
    assert len(snapshots) > 10
    assert any(swap.new is None for swap in result.swaps)  # a segment left empty, deleted
    for directory in snapshots:
        assert not (directory / "clean-shutdown").exists()
        reopened = open_stream(directory)
        assert not (directory / COMPACTION_DIR).exists()
        check_consistent(surviving(reopened), model, bounds, removed)
        reopened.close()
    final = open_stream(snapshots[-1])
    assert surviving(final).keys() == model.keys() - removed
    final.close()
    stream.close()


def generate(n: int) -> tuple[str | None, bytes]:
    """The record at offset ``n`` in the killed processes' stream."""
    if n % 13 == 0:
        return None, b"unkeyed %d" % n
    return f"k{n % 9}", b"" if n % 17 == 0 else b"value %d" % n


CHILD = """
import sys
from pathlib import Path

from tqbroker.backends.log.log import Log
from tqbroker.backends.log.stream import LogStream
from tqbroker.broker.streams.compaction import compaction_policy
from tqbroker.model import Message
from tqbroker.protocol.methods import BasicProperties

directory = Path(sys.argv[1])
stream = LogStream(directory, Log(directory, segment_bytes=1500, index_interval_bytes=100))
stream.open()
policy = compaction_policy("key", tombstone_grace_ms=40)
n = stream.next_offset
print("ready", n, flush=True)
while True:
    key, body = generate(n)
    raw = BasicProperties(headers={"key": key} if key is not None else None).encode()
    assert stream.append(Message("ex", "rk", raw, body, timestamp_ms=T0 + n)) == n
    stream.seal()
    stream.log.write_out()  # a kill loses at most the record being appended
    n += 1
    if n % 50 == 25:  # progress, away from the compactions and flushes
        print("appended", n, flush=True)
    if n % 150 == 0:
        work = stream.compaction_work(policy, T0 + n)
        if work is not None:
            stream.finish_compaction(work())
    if n % 400 == 0:
        flush = stream.begin_flush()
        if flush is not None:
            flush()
"""


@pytest.mark.parametrize("seed", range(3))
def test_processes_killed_while_they_compact_leave_a_consistent_stream(
    tmp_path: Path, seed: int
) -> None:
    """Processes in turn append to one stream and compact it, each killed with SIGKILL once it
    has appended (and compacted) a while; every restart must find each key's latest record (or
    none, for a tombstone past its grace), every unkeyed record, and nothing that was not
    appended."""
    source = "\n".join((f"T0 = {T0}", inspect.getsource(generate), CHILD))
    for round_ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", source, str(tmp_path)], stdout=subprocess.PIPE
        )
        assert child.stdout is not None
        ready, first = child.stdout.readline().split()
        assert ready == b"ready"
        # Past a compaction at least, then further by the seed: the kill lands in a different
        # place each round, however fast the host is.
        target = int(first) + 160 + 120 * ((seed * 3 + round_) % 4)
        appended = int(first)
        while appended < target:  # the test's timeout bounds it: the child reports steadily
            line = child.stdout.readline()
            assert line.startswith(b"appended "), f"the child stopped: {line!r}"
            appended = int(line.split()[1])
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        stream = open_stream(tmp_path)
        end = stream.next_offset
        found = {o: (e[0], e[1]) for o, e in surviving(stream).items()}
        stream.close()
        assert end > 150 * (round_ + 1)
        assert len(found) < end  # compacted
        latest: dict[str, int] = {}
        for n in range(end):
            key, body = generate(n)
            if key is None:
                assert found.get(n) == (key, body)  # never compacted away
            else:
                latest[key] = n
        for offset, e in found.items():
            assert generate(offset) == e
        for key, offset in latest.items():
            kept = [o for o in found if found[o][0] == key]
            tombstone = not generate(offset)[1]
            assert (max(kept) if kept else None) in ((offset, None) if tombstone else (offset,))


# -- the Trio thread meanwhile -----------------------------------------------------------------


async def test_reads_appends_and_retention_go_on_while_the_work_runs(tmp_path: Path) -> None:
    stream = open_stream(tmp_path, segment_bytes=64 * 1024)
    for n in range(40_000):
        append(stream, message(f"k{n % 500}", b"v%d." % n + b"x" * 80, T0 + n))
    flush(stream)
    segments = len(stream.log.segments)
    assert segments > 20
    work = stream.compaction_work(POLICY, T0 + 40_000)
    assert work is not None
    done = False
    reads = appends = 0
    retention_removed = 0

    async def meanwhile() -> None:
        nonlocal reads, appends, retention_removed
        offset = 0
        while not done:
            record = stream.read_from(offset)
            offset = record.offset + 1 if record is not None else stream.first_offset
            reads += 1
            append(stream, message("new", b"meanwhile", T0))
            appends += 1
            if reads == 100:
                retention_removed = stream.apply_retention(
                    max_bytes=(segments - 2) * 64 * 1024, max_age_ms=None, now_ms=T0
                )
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(meanwhile)
        result = await trio.to_thread.run_sync(work)
        done = True
    assert reads > 200  # the Trio thread was never kept waiting for the work
    assert retention_removed >= 1
    removed = stream.finish_compaction(result)
    assert removed > 30_000
    found = surviving(stream)
    assert sum(1 for e in found.values() if e[0] == "new") == appends
    assert {e[0] for e in found.values()} == {f"k{n}" for n in range(500)} | {"new"}
    for n in range(500):  # the latest of each key, at its original offset
        offset = 39_500 + n
        assert found[offset] == (f"k{n}", b"v%d." % offset + b"x" * 80, T0 + offset)
    flush(stream)
    stream.close()
    stream = open_stream(tmp_path)
    assert surviving(stream) == found
    stream.close()


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_replaced_segments_are_closed_by_the_next_flush(tmp_path: Path) -> None:
    stream, _model = build(tmp_path)
    before = fd_count()
    assert compact(stream, POLICY, T0 + 10**6)
    assert fd_count() > before  # the copies' files, and still those they replaced
    assert stream.needs_flush
    flush(stream)
    assert fd_count() < before  # three per segment: the copies, fewer (some left nothing)
    assert not stream.needs_flush
    stream.close()
