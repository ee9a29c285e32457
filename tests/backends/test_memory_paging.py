"""Paging out a long in-memory queue (``backends/paging.py``): what goes out comes back whole and
in order, the files go when the messages do, and a paged-out message costs no memory."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tqbroker.backends import paging
from tqbroker.backends.memory import MemoryBackend
from tqbroker.backends.paging import PageFile
from tqbroker.model import Message

PERSISTENT_RAW = b"\x10\x00\x02"


def message(n: int, size: int) -> Message:
    body = (b"%08d" % n + bytes(range(256)) * (size // 256 + 1))[:size]
    return Message("ex", f"key.{n}", PERSISTENT_RAW, body, timestamp_ms=1_700_000_000_000 + n)


def test_a_page_file_gives_back_what_it_took_in_order(tmp_path: Path) -> None:
    rng = random.Random(7)
    pages = PageFile(tmp_path)
    sizes = [rng.choice([0, 1, 100, 5000, 2 * paging.READ_CHUNK]) for _ in range(300)]
    taken: list[tuple[int, Message]] = []
    for n, size in enumerate(sizes):
        pages.append(n + 1, message(n, size))
        if rng.random() < 0.2:
            taken += pages.take(rng.randint(1, 50))
    while pages.count:
        taken += pages.take(rng.randint(1, 50))
    assert [i for i, _m in taken] == list(range(1, 301))
    for (_i, got), (n, size) in zip(taken, enumerate(sizes), strict=True):
        want = message(n, size)
        assert (got.exchange, got.routing_key, got.body, got.properties_raw, got.timestamp_ms) == (
            want.exchange,
            want.routing_key,
            want.body,
            want.properties_raw,
            want.timestamp_ms,
        )
    assert list(tmp_path.iterdir()) == []  # drained: no file left


def test_segments_roll_and_go_once_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging, "SEGMENT_BYTES", 64 * 1024)
    pages = PageFile(tmp_path)
    for n in range(500):
        pages.append(n, message(n, 1000))
    assert len(list(tmp_path.iterdir())) >= 7
    pages.take(250)
    assert 3 <= len(list(tmp_path.iterdir())) <= 5  # the read segments are gone
    pages.clear()
    assert list(tmp_path.iterdir()) == []


def test_a_long_memory_queue_pages_out_and_back_in_order(tmp_path: Path) -> None:
    backend = MemoryBackend(page_window=100)
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    for n in range(5000):
        store.push(message(n, 1024))
    assert store.ready_count == 5000
    assert store.ready_bytes == 5000 * 1024
    assert len(store._ready) == 100  # the rest is on disk
    pages_dir = tmp_path / "memory-pages"
    assert any(pages_dir.iterdir())
    popped = []
    while (entry := store.pop()) is not None:
        message_id = entry[0]
        popped.append(message_id)
        if message_id % 7 == 0:
            store.requeue(message_id)  # comes back before anything newer
            again = store.pop()
            assert again is not None
            assert again[0] == message_id
            assert again[2] is True
        store.ack(message_id)
    assert popped == list(range(1, 5001))
    assert store.ready_count == 0
    assert list(pages_dir.iterdir()) == []


def test_deleting_or_purging_a_paged_queue_removes_its_files(tmp_path: Path) -> None:
    backend = MemoryBackend(page_window=10)
    backend.open(tmp_path)
    purged = backend.open_queue("/", "purged")
    deleted = backend.open_queue("/", "deleted")
    for n in range(100):
        purged.push(message(n, 100))
        deleted.push(message(n, 100))
    assert purged.purge() == 100
    backend.delete_queue("/", "deleted")
    assert list((tmp_path / "memory-pages").iterdir()) == []
    purged.push(message(0, 10))  # in memory again: the window is free
    assert purged.ready_count == 1
    backend.close()


def test_a_restart_wipes_what_was_paged_out(tmp_path: Path) -> None:
    backend = MemoryBackend(page_window=1)
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    for n in range(10):
        store.push(message(n, 100))  # a crash now leaves files behind...
    again = MemoryBackend(page_window=1)
    again.open(tmp_path)  # ...which the next start removes
    assert not (tmp_path / "memory-pages").exists()
