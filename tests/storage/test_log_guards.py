"""Log-backend details the mutation session found unguarded: recovery refusing a record whose
offset goes back (a stale record after the tail would otherwise make the log reuse offsets), and
the settled ranges of a queue staying merged (acks behind an unacked head must not grow the
checkpoint by one range each)."""

from __future__ import annotations

import random
from pathlib import Path

import cbor2

from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.ranges import RangeSet
from tqbroker.backends.log.segment import segment_name
from tqbroker.backends.log.store import STATE_FILE
from tqbroker.model import Message

from .logdata import T0, append_random, assert_log_holds, open_log, record_bounds, sync


def test_a_stale_record_after_the_tail_is_cut_not_taken(tmp_path: Path) -> None:
    """A valid record (good CRC) whose offset is below the one expected — a stale copy left
    after the tail — ends the valid prefix: recovery cuts it off, and the next append takes the
    next offset, never one already used."""
    rng = random.Random(7)
    log, _clean = open_log(tmp_path)
    expected, _ts = append_random(log, rng, 60, T0)
    sync(log)
    active = log.segments[-1].base_offset
    log.close(clean=False)  # a crash after the last fsync
    path = tmp_path / segment_name(active, ".log")
    data = path.read_bytes()
    start, end = record_bounds(path)[0]
    path.write_bytes(data + data[start:end])  # the active segment's first record, again

    log, clean = open_log(tmp_path)
    assert not clean
    assert_log_holds(log, expected)
    assert path.read_bytes() == data
    more, _ts = append_random(log, rng, 1, T0 + 10_000)
    assert [e.offset for e in more] == [len(expected)]
    log.close(clean=True)


def test_adjacent_settled_ranges_merge() -> None:
    ranges = RangeSet()
    ranges.add(5, 7)
    ranges.add(7, 9)  # adjacent after
    ranges.add(3, 5)  # adjacent before
    assert ranges.as_list() == [(3, 9)]
    assert ranges.pop_prefix(3) == 9


def test_acks_behind_an_unacked_head_keep_the_checkpoint_small(tmp_path: Path) -> None:
    backend = LogBackend()
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    for n in range(500):
        store.push(Message("", "q", b"\x00\x00", b"%d" % n, timestamp_ms=T0), persistent=True)
    popped = [store.pop() for _ in range(500)]
    ids = [p[0] for p in popped if isinstance(p, tuple)]
    assert len(ids) == 500
    for message_id in ids[1:]:  # the first stays unacked: the head cannot move past it
        store.ack(message_id)
    work = backend.begin_flush()
    assert work is not None
    work()
    state = cbor2.loads((store.directory / STATE_FILE).read_bytes())
    assert state["settled"] == [[ids[1], ids[-1] + 1]]
    backend.close()
