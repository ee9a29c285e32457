"""Conformance cases for streams (``tqbroker.backends.streams``): the replication primitives.

Run on every backend that offers streams (``StreamBackend``): a follower's ``append_frames``
of a leader's ``read_frames`` (byte-identical frames at the same offsets, refused whole when
they do not continue the log or fail their CRC), the leader epoch history, truncation,
the replica identity and producer states; each across a restart and a crash for a durable
backend.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

from ...backends.streams import (
    NO_EPOCH,
    InvalidFrame,
    OffsetMismatch,
    ProducerState,
    StaleEpoch,
    StreamLog,
    truncate,
)
from .harness import T0_MS, BackendFactory, BackendHarness, CaseList, make_message

log = logging.getLogger(__name__)

STREAM_CASES = CaseList()
"""This module's cases, in the order they run."""
_case = STREAM_CASES.case

Frames = list[tuple[bytes, bytes]]


def _fill(h: BackendHarness, stream: StreamLog, count: int, start: int = 0) -> None:
    """Append ``count`` records in runs of varied length (batches and single records), then
    flush: every one durable."""
    n = start
    while n < start + count:
        run = min(1 + n % 5, start + count - n)
        messages = [
            make_message(
                b"record %d " % i + b"." * (i % 97), routing_key=f"k{i % 3}", timestamp_ms=T0_MS + i
            )
            for i in range(n, n + run)
        ]
        taken, error = stream.append_many(messages)
        assert (taken, error) == (run, None), f"append_many took {taken} of {run}: {error}"
        h.flush()  # each run its own flush: frames of several sizes
        n += run
    assert stream.durable_end == stream.next_offset, "a flush left records past durable_end"


def _all_frames(stream: StreamLog, start: int = 0, max_bytes: int = 700) -> Frames:
    """Every frame from ``start`` to the durable end, fetched as a follower fetches."""
    frames: Frames = []
    position = start
    while position < stream.durable_end:
        got, position = stream.read_frames(position, stream.durable_end, max_bytes)
        frames += got
    return frames


def _bodies(stream: StreamLog, start: int, end: int) -> dict[int, bytes]:
    return {r.offset: bytes(r.message.body) for r in stream.read_many(start, end, 1 << 20)}


def _replicate(follower: StreamLog, leader: StreamLog, epoch: int) -> None:
    """Copy the leader's durable frames past the follower's end, in fetches."""
    position = follower.next_offset
    while position < leader.durable_end:
        frames, position = leader.read_frames(position, leader.durable_end, 700)
        follower.append_frames(frames, epoch)


@_case("streams")
def check_append_frames_makes_byte_identical_replicas(
    factory: BackendFactory, data_dir: Path
) -> None:
    """A follower that appends what ``read_frames`` of its leader returned holds the same
    frames, byte for byte, at the same offsets, and the same records; they are durable at
    its next flush (``durable_end`` moves then, not before), and after a restart."""
    with BackendHarness(factory, data_dir) as h:
        leader, follower = h.stream("leader"), h.stream("follower")
        _fill(h, leader, 60)
        _replicate(follower, leader, 0)
        assert follower.next_offset == leader.next_offset == 60
        assert follower.durable_end == 0, "append_frames moved durable_end before a flush"
        h.flush()
        assert follower.durable_end == 60, f"durable_end {follower.durable_end} after a flush"
        assert _all_frames(follower) == _all_frames(leader), "the replica's frames differ"
        assert _bodies(follower, 0, 60) == _bodies(leader, 0, 60)
        _fill(h, leader, 15, start=60)  # fetches go on where the follower ends
        _replicate(follower, leader, 0)
        h.flush()
        assert _all_frames(follower, 30, 300) == _all_frames(leader, 30, 300)
        if h.durable:
            h.crash()
            leader, follower = h.stream("leader"), h.stream("follower")
            assert follower.next_offset == 75
            assert _all_frames(follower) == _all_frames(leader), "frames differ after a crash"
            _fill(h, follower, 3, start=75)  # a replica that becomes leader appends on
            assert _bodies(follower, 75, 78) == {
                n: b"record %d " % n + b"." * (n % 97) for n in range(75, 78)
            }


@_case("streams")
def check_append_frames_refuses_frames_that_do_not_continue_the_log(
    factory: BackendFactory, data_dir: Path
) -> None:
    """The first frame must start at ``next_offset`` and each next one above the last:
    ``OffsetMismatch`` (a ``ValueError``) otherwise, and nothing of the call is appended."""
    with BackendHarness(factory, data_dir) as h:
        leader, follower = h.stream("leader"), h.stream("follower")
        _fill(h, leader, 30)
        frames = _all_frames(leader)
        assert len(frames) >= 4
        follower.append_frames(frames[:2], 0)
        end = follower.next_offset
        for bad, what in (
            (frames[3:], "a gap before the first frame"),
            (frames[:1], "frames the follower has already"),
            (frames[2:3] + frames[2:3], "a frame repeated"),
            (frames[2:3] + frames[4:5] + frames[3:4], "frames out of order"),
        ):
            try:
                follower.append_frames(bad, 0)
            except OffsetMismatch:
                pass
            else:
                raise AssertionError(f"append_frames took {what}")
            assert follower.next_offset == end, (
                f"{what}: next_offset moved to {follower.next_offset}"
            )
        follower.append_frames(frames[2:], 0)
        h.flush()
        assert _all_frames(follower) == frames


@_case("streams")
def check_append_frames_refuses_a_damaged_frame(factory: BackendFactory, data_dir: Path) -> None:
    """A frame whose CRC fails (one flipped bit anywhere after its length) or whose length
    does not match its bytes is ``InvalidFrame`` (a ``ValueError``): nothing of the call is
    appended, the frames before it in the call included."""
    with BackendHarness(factory, data_dir) as h:
        leader, follower = h.stream("leader"), h.stream("follower")
        _fill(h, leader, 20)
        frames = _all_frames(leader)
        head, rest = frames[1]
        for n, (bad_head, bad_rest) in enumerate(
            (
                (head, rest[:7] + bytes([rest[7] ^ 0x10]) + rest[8:]),  # the offset field
                (head, rest[:-1] + bytes([rest[-1] ^ 1])),  # the last byte
                (head[:4] + bytes([head[4] ^ 0x80]) + head[5:], rest),  # the CRC itself
                (head, rest[:-1]),  # cut short
            )
        ):
            try:
                follower.append_frames([frames[0], (bad_head, bad_rest), *frames[2:]], 0)
            except InvalidFrame:
                pass
            else:
                raise AssertionError(f"damage {n}: append_frames took a damaged frame")
            assert follower.next_offset == 0, f"damage {n}: something was appended"
        follower.append_frames(frames, 0)
        h.flush()
        assert _bodies(follower, 0, 20) == _bodies(leader, 0, 20)


@_case("streams")
def check_leader_epochs_and_their_history(factory: BackendFactory, data_dir: Path) -> None:
    """``begin_epoch`` records (epoch, next_offset); the same epoch again changes nothing, a
    lower one is ``StaleEpoch``; ``append_frames`` with a higher epoch begins it at the first
    offset it appends, with a lower one is refused; ``end_offset_for_epoch`` is the start of
    the first later epoch (or the log end). The history survives a restart and a crash."""
    with BackendHarness(factory, data_dir) as h:
        leader, follower = h.stream("leader"), h.stream("follower")
        assert leader.leader_epoch == NO_EPOCH
        assert list(leader.epoch_history) == []
        leader.begin_epoch(1)
        _fill(h, leader, 10)
        leader.begin_epoch(1)
        leader.begin_epoch(4)
        _fill(h, leader, 10, start=10)
        leader.begin_epoch(6)
        assert list(leader.epoch_history) == [(1, 0), (4, 10), (6, 20)]
        assert leader.leader_epoch == 6
        try:
            leader.begin_epoch(5)
        except StaleEpoch:
            pass
        else:
            raise AssertionError("begin_epoch took an epoch below the current one")
        expected = {0: 0, 1: 10, 2: 10, 3: 10, 4: 20, 5: 20, 6: 20, 7: 20}
        got = {e: leader.end_offset_for_epoch(e) for e in expected}
        assert got == expected, f"end_offset_for_epoch: {got}, expected {expected}"
        frames = _all_frames(leader)
        split = next(i for i, (_h, rest) in enumerate(frames) if int.from_bytes(rest[:8]) >= 10)
        follower.append_frames(frames[:split], 1)
        follower.append_frames(frames[split:], 4)
        assert list(follower.epoch_history) == [(1, 0), (4, 10)]
        try:
            follower.append_frames([], 2)
        except StaleEpoch:
            pass
        else:
            raise AssertionError("append_frames took an epoch below the current one")
        h.flush()
        if h.durable:
            h.restart()
            assert list(h.stream("leader").epoch_history) == [(1, 0), (4, 10), (6, 20)]
            h.stream("leader").begin_epoch(7)
            h.crash()
            # epoch 6 took no record: epoch 7 begins at the same offset in its place
            assert list(h.stream("leader").epoch_history) == [(1, 0), (4, 10), (7, 20)]
            assert list(h.stream("follower").epoch_history) == [(1, 0), (4, 10)]


def _truncated(h: BackendHarness, stream: StreamLog, offset: int, end: int) -> None:
    assert stream.next_offset == end, f"truncation to {offset}: next_offset {stream.next_offset}"
    assert stream.durable_end == end, f"truncation to {offset}: durable_end {stream.durable_end}"
    assert stream.read(end) is None
    assert stream.read_from(end) is None
    last = stream.read_many(0, 1 << 40, 1 << 20)[-1:]
    assert not last or last[0].offset < end, f"truncation to {offset}: {last[0].offset} is left"


@_case("streams")
def check_a_truncation_removes_the_records_at_and_past_it(
    factory: BackendFactory, data_dir: Path
) -> None:
    """A truncation (``begin_truncation``) removes every record at or past the offset (a
    frame that holds records on both sides goes whole: the log then ends at its first
    offset), moves ``next_offset`` and ``durable_end`` down, trims the epoch history, clamps
    stored offsets; appends go on at the new end, and reads give the new records, never the
    old ones; after a crash right after it, nothing removed comes back."""
    with BackendHarness(factory, data_dir) as h:
        stream = h.stream()
        stream.begin_epoch(1)
        _fill(h, stream, 40)
        stream.begin_epoch(2)
        _fill(h, stream, 40, start=40)
        stream.begin_epoch(3)
        stream.store_offset("tag", 70)
        stream.commit_group_offset("group", 30)
        h.flush()
        frames = _all_frames(stream)
        firsts = [int.from_bytes(rest[:8]) for _head, rest in frames]
        batch_at = next(f for f, g in itertools.pairwise(firsts) if g - f > 1 and 41 < f < 70)
        boundary = next(f for f in firsts if f > 70)  # a frame's first offset: cut there
        truncate(stream, boundary)
        _truncated(h, stream, boundary, boundary)
        truncate(stream, batch_at + 1)  # inside a batch: the batch goes whole
        end = batch_at
        _truncated(h, stream, batch_at + 1, end)
        assert stream.read(end - 1) is not None
        assert list(stream.epoch_history) == [(1, 0), (2, 40)]
        assert stream.offsets["tag"] == end
        assert stream.group_offsets["group"] == 30
        if h.durable:
            h.crash()
            stream = h.stream()
            _truncated(h, stream, batch_at + 1, end)
            assert list(stream.epoch_history) == [(1, 0), (2, 40)]
            assert stream.offsets["tag"] == end
        stream.begin_epoch(5)
        messages = [make_message(b"new %d" % n, timestamp_ms=T0_MS) for n in range(end, end + 8)]
        taken, error = stream.append_many(messages)
        assert taken == 8
        assert error is None
        h.flush()
        got = _bodies(stream, end, end + 8)
        assert got == {n: b"new %d" % n for n in range(end, end + 8)}, "old records read back"
        truncate(stream, 0)  # everything
        _truncated(h, stream, 0, 0)
        assert list(stream.epoch_history) == []
        if h.durable:
            h.crash()
            _truncated(h, h.stream(), 0, 0)


@_case("streams")
def check_a_restart_empties_the_log_and_continues_at_the_offset(
    factory: BackendFactory, data_dir: Path
) -> None:
    """A restart (``begin_restart``: a follower whose leader's log starts past its end)
    removes every record and continues at the offset: ``first_offset``, ``next_offset`` and
    ``durable_end`` are there, the epoch history is empty, the replica id and stored offsets
    stay; appends go on there, and after a crash nothing removed comes back."""
    with BackendHarness(factory, data_dir) as h:
        stream = h.stream()
        replica_id = stream.replica_id
        stream.begin_epoch(1)
        _fill(h, stream, 30)
        stream.store_offset("tag", 20)
        h.flush()
        for step in stream.begin_restart(500):
            step()

        def restarted(stream: StreamLog, end: int) -> None:
            assert (stream.first_offset, stream.next_offset) == (500, end)
            assert stream.durable_end == end
            first = stream.read_from(0)
            assert first is None or first.offset >= 500, "a removed record read back"
            assert stream.replica_id == replica_id
            assert stream.offsets["tag"] == 20

        restarted(stream, 500)
        assert list(stream.epoch_history) == []
        if h.durable:
            h.crash()
            stream = h.stream()
            restarted(stream, 500)
        stream.begin_epoch(2)
        _fill(h, stream, 10, start=500)
        assert _bodies(stream, 0, 1000).keys() == set(range(500, 510))
        assert list(stream.epoch_history) == [(2, 500)]
        if h.durable:
            h.crash()
            stream = h.stream()
            restarted(stream, 510)


@_case("streams")
def check_replica_id_is_kept_until_the_stream_is_deleted(
    factory: BackendFactory, data_dir: Path
) -> None:
    """Every stream has a replica id (a UUID): the same after a restart and a crash, another
    stream's differs, and a stream deleted and created again gets a new one."""
    with BackendHarness(factory, data_dir) as h:
        first, other = h.stream().replica_id, h.stream("other").replica_id
        assert first
        assert other
        assert first != other
        if h.durable:
            h.restart()
            assert h.stream().replica_id == first
            h.crash()
            assert h.stream().replica_id == first
        h.backend.delete_queue("/", "s")
        h.flush()
        assert h.stream().replica_id not in (first, other)


@_case("streams")
def check_producer_states_are_kept_with_the_records(
    factory: BackendFactory, data_dir: Path
) -> None:
    """``record_producer(producer, epoch, sequence)``: ``producers`` gives each producer's
    ``ProducerState``; it is durable with the next flush."""
    with BackendHarness(factory, data_dir) as h:
        stream = h.stream()
        stream.record_producer("p1", 0, 5)
        stream.record_producer("p2", 3, 12)
        stream.record_producer("p1", 1, 0)
        want = {"p1": ProducerState(1, 0), "p2": ProducerState(3, 12)}
        assert dict(stream.producers) == want
        h.flush()
        if h.durable:
            h.crash()
            assert dict(h.stream().producers) == want
