"""Kafka's torn-tail and index-recovery tests, on ``Log`` directly with real files: garbage after
the last record, a record cut at every byte, missing / garbage / orphan index files. Recovery must
give back exactly the valid prefix, byte for byte, and the log must go on appending after it."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from tqbroker.backends.log.format import INDEX_ENTRY, TIME_ENTRY
from tqbroker.backends.log.log import Log
from tqbroker.backends.log.recovery import CLEAN_MARKER
from tqbroker.backends.log.segment import segment_name

from .logdata import (
    T0,
    Expected,
    append_random,
    as_expected,
    assert_log_holds,
    first_at_or_after,
    open_log,
    record_bounds,
    segment_files,
    sync,
)


def timestamp_samples(expected: list[Expected], rng: random.Random) -> list[int]:
    stamps = sorted({e.timestamp_ms for e in expected})
    sample = rng.sample(stamps, min(40, len(stamps)))
    return sorted(
        {T0 - 10, 0, stamps[0], stamps[-1], stamps[-1] + 1, stamps[-1] + 1000}
        | set(sample)
        | {s - 1 for s in sample}
        | {s + 1 for s in sample}
    )


def assert_timestamps(log: Log, expected: list[Expected], samples: list[int]) -> None:
    got = {t: log.reader.offset_for_timestamp(t) for t in samples}
    assert got == {t: first_at_or_after(expected, t) for t in samples}


def continue_appending(log: Log, rng: random.Random, expected: list[Expected], ts: int) -> None:
    """New appends take the next offsets and read back, before and after a clean reopen."""
    more, ts = append_random(log, rng, 30, ts)
    assert [e.offset for e in more] == list(range(len(expected), len(expected) + 30))
    assert_log_holds(log, expected + more)
    sync(log)
    log.close(clean=True)
    directory = log.directory
    log, clean = open_log(directory)
    assert clean
    assert_log_holds(log, expected + more)
    log.close(clean=True)


# -- garbage after the last record ---------------------------------------------------------------


@pytest.mark.parametrize("target", [".log", ".index", ".timeindex"])
@pytest.mark.parametrize("seed", range(10))
def test_garbage_appended_to_the_active_segment_is_removed(
    tmp_path: Path, target: str, seed: int
) -> None:
    rng = random.Random(f"{target}-{seed}")
    log, clean = open_log(tmp_path)
    assert not clean
    expected, ts = append_random(log, rng, rng.randint(80, 160), T0)
    sync(log)
    assert len(log.segments) >= 3
    samples = timestamp_samples(expected, rng)
    active = log.segments[-1].base_offset
    before = segment_files(tmp_path)
    log.close(clean=False)  # a crash after the last fsync

    with open(tmp_path / segment_name(active, target), "ab") as f:
        f.write(rng.randbytes(rng.randint(1, 1024)))

    # Scan everything, or only the active segment (the others ended before the recovery point).
    log, clean = open_log(tmp_path, recovery_point=rng.choice([0, len(expected)]))
    assert not clean
    # The garbage is gone and the indexes are rebuilt exactly as they were written.
    assert segment_files(tmp_path) == before
    assert_log_holds(log, expected)
    assert_timestamps(log, expected, samples)
    continue_appending(log, rng, expected, ts)


# -- a record cut anywhere ---------------------------------------------------------------------


def test_active_segment_cut_at_every_byte_of_its_last_two_records(tmp_path: Path) -> None:
    rng = random.Random(2024)
    pristine = tmp_path / "pristine"
    log, _ = open_log(pristine)
    expected, ts = append_random(log, rng, 70, T0, max_body=300)
    active = log.segments[-1]
    while active.next_offset - active.base_offset < 3:  # the last two are not the first
        more, ts = append_random(log, rng, 1, ts, max_body=300)
        expected += more
        active = log.segments[-1]
    more, ts = append_random(log, rng, 2, ts, max_body=60)  # the two that get cut
    expected += more
    assert log.segments[-1] is active
    sync(log)
    base, name = active.base_offset, active.log_path.name
    log.close(clean=False)
    bounds = record_bounds(pristine / name)
    assert len(bounds) >= 4
    first_cut = bounds[-2][0]

    work = tmp_path / "work"
    for cut in range(first_cut, bounds[-1][1]):
        shutil.copytree(pristine, work)
        os.truncate(work / name, cut)
        survivors = sum(1 for _start, end in bounds if end <= cut)
        boundary = bounds[survivors - 1][1] if survivors else 0
        prefix = expected[: base + survivors]

        log, clean = open_log(work, recovery_point=0 if cut % 2 else len(expected))
        assert not clean
        assert (work / name).stat().st_size == boundary, cut
        assert_log_holds(log, prefix)
        again, _ = append_random(log, rng, 2, ts)
        assert [e.offset for e in again] == [len(prefix), len(prefix) + 1], cut
        assert_log_holds(log, prefix + again)
        log.close(clean=False)
        shutil.rmtree(work)


def test_cut_records_in_several_segments_keeps_the_prefix_before_the_first(
    tmp_path: Path,
) -> None:
    """A crash can leave more than the active segment short (no fsync since the roll): recovery
    keeps everything before the first bad record and drops every later segment."""
    rng = random.Random(5)
    log, _ = open_log(tmp_path)
    expected, _ts = append_random(log, rng, 120, T0)
    sync(log)
    bases = [s.base_offset for s in log.segments]
    log.close(clean=False)
    victim = bases[-3]
    bounds = record_bounds(tmp_path / segment_name(victim, ".log"))
    os.truncate(tmp_path / segment_name(victim, ".log"), bounds[2][0] + 5)
    os.truncate(tmp_path / segment_name(bases[-1], ".log"), 7)

    log, clean = open_log(tmp_path, recovery_point=victim)
    assert not clean
    assert_log_holds(log, expected[: victim + 2])
    assert [s.base_offset for s in log.segments] == bases[:-2]
    leftover = {p.name for p in tmp_path.iterdir()}
    for base in bases[-2:]:
        assert not {segment_name(base, s) for s in (".log", ".index", ".timeindex")} & leftover
    log.close(clean=False)


# -- missing, garbage and orphan indexes ----------------------------------------------------------

MUTATIONS = [
    "delete",
    "delete-time-only",
    "random-garbage",
    "zeros",
    "ones",
    "partial-entry",
    "swap-between-segments",
    "shifted-position",
    "orphans",
]
# How the log was left: clean marker, or a crash with recovery from the start / from the end.
SHUTDOWNS = ["clean", "crash-scan-all", "crash-scan-active"]


def mutate_indexes(directory: Path, mutation: str, rng: random.Random, bases: list[int]) -> None:
    index_files = sorted(p for p in directory.iterdir() if p.suffix in (".index", ".timeindex"))
    if mutation == "delete":
        for p in index_files:
            p.unlink()
    elif mutation == "delete-time-only":
        for p in index_files:
            if p.suffix == ".timeindex":
                p.unlink()
    elif mutation == "random-garbage":
        for p in index_files:
            entry = INDEX_ENTRY.size if p.suffix == ".index" else TIME_ENTRY.size
            length = rng.choice([rng.randint(1, 1024), entry * rng.randint(3, 60)])
            p.write_bytes(rng.randbytes(length))
    elif mutation in ("zeros", "ones"):
        fill = b"\x00" if mutation == "zeros" else b"\xff"
        for p in index_files:
            p.write_bytes(fill * p.stat().st_size)
    elif mutation == "partial-entry":
        for p in index_files:
            os.truncate(p, p.stat().st_size - 3)
    elif mutation == "swap-between-segments":
        for suffix in (".index", ".timeindex"):
            a, b = (directory / segment_name(base, suffix) for base in bases[:2])
            data_a, data_b = a.read_bytes(), b.read_bytes()
            a.write_bytes(data_b)
            b.write_bytes(data_a)
    elif mutation == "shifted-position":
        # One entry in the middle of every offset index points 1 byte into its record.
        for p in index_files:
            if p.suffix == ".index":
                raw = bytearray(p.read_bytes())
                i = (len(raw) // INDEX_ENTRY.size) // 2
                relative, position = INDEX_ENTRY.unpack_from(raw, i * INDEX_ENTRY.size)
                INDEX_ENTRY.pack_into(raw, i * INDEX_ENTRY.size, relative, position + 1)
                p.write_bytes(bytes(raw))
    elif mutation == "orphans":
        for base in (bases[-1] + 100_000, bases[1] + 1, 7 * 10**15):
            for suffix in (".index", ".timeindex"):
                (directory / segment_name(base, suffix)).write_bytes(rng.randbytes(48))
    else:
        raise AssertionError(mutation)


@pytest.mark.parametrize("shutdown", SHUTDOWNS)
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_missing_garbage_or_orphan_indexes_are_rebuilt(
    tmp_path: Path, mutation: str, shutdown: str
) -> None:
    rng = random.Random(f"{mutation}-{shutdown}")
    log, _ = open_log(tmp_path)
    expected, ts = append_random(log, rng, 200, T0)
    sync(log)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4
    assert all(len(s.offset_index.keys) >= 3 for s in log.segments[:-1])
    samples = timestamp_samples(expected, rng)
    assert_log_holds(log, expected)
    reads_before = [as_expected(log.reader.read(offset)) for offset in range(-1, len(expected) + 2)]
    times_before = [log.reader.offset_for_timestamp(t) for t in samples]
    assert_timestamps(log, expected, samples)
    before = segment_files(tmp_path)
    log.close(clean=shutdown == "clean")
    assert (tmp_path / CLEAN_MARKER).exists() == (shutdown == "clean")

    mutate_indexes(tmp_path, mutation, rng, bases)

    recovery_point = len(expected) if shutdown == "crash-scan-active" else 0
    log, clean = open_log(tmp_path, recovery_point=recovery_point)
    assert clean == (shutdown == "clean")
    assert not (tmp_path / CLEAN_MARKER).exists()
    # Orphans are gone, every index is back exactly as it was written.
    assert segment_files(tmp_path) == before
    assert [as_expected(log.reader.read(o)) for o in range(-1, len(expected) + 2)] == reads_before
    assert [log.reader.offset_for_timestamp(t) for t in samples] == times_before
    assert log.reader.corrupt_records == 0
    continue_appending(log, rng, expected, ts)
