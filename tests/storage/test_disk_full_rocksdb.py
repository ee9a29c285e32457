"""RocksDB as the durable backend on a full disk (the tmpfs of ``conftest.py``): RocksDB writes a
new MANIFEST whenever it opens read-write, so the backend opens an existing database read-only
and starts its run at the first flush that finds space; a new database cannot be created at all.

Needs root (``mount -t tmpfs``); skipped otherwise, or without ``tqbroker-rocksdb``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tqbroker.backends import FLUSH_FIRST
from tqbroker.model import Message
from tqbroker.protocol.methods import BasicProperties
from tqbroker.testing import BrokerProcess

from .test_disk_full import fill_completely, start

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="mounts a tmpfs: needs root on Linux",
)
pytest.importorskip("tqbroker_rocksdb")

from tqbroker_rocksdb import RocksDBBackend  # noqa: E402
from tqbroker_rocksdb.codec import META_EPOCH, TRANSIENT, TRANSIENT_END  # noqa: E402


def test_rocksdb_cannot_create_its_database_on_a_full_disk_and_says_so_in_one_line(
    tmpfs: Path, tmp_path: Path, brokers: list[BrokerProcess]
) -> None:
    """A new database needs space (RocksDB writes a MANIFEST, rocksdict its settings): a first
    start on a full disk fails, with one line naming the directory and no traceback."""
    fill_completely(tmpfs)
    with pytest.raises(RuntimeError, match="exit status 1") as failed:
        start(brokers, tmpfs, tmp_path, durable_backend="rocksdb")
    log = (tmp_path / "broker.log").read_text()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if line.startswith("tqbroker: cannot start")]
    assert len(lines) == 1, log
    assert f"cannot open the RocksDB database in {tmpfs / 'data' / 'rocksdb'}: " in lines[0]
    assert "No space left on device" in lines[0]
    assert "cannot start" in str(failed.value)


def test_rocksdb_opens_read_only_on_a_full_disk_and_starts_its_run_once_space_is_back(
    tmpfs: Path,
) -> None:
    """RocksDB writes a new MANIFEST whenever it opens read-write, so on a full disk the backend
    opens the database read-only: recovered messages are delivered, writes (the run's new epoch
    included) wait for the first flush that can write, which reopens it read-write."""

    def message(body: bytes, mode: int = 2) -> Message:
        return Message("", "q", BasicProperties(delivery_mode=mode).encode(), body)

    def flush(backend: RocksDBBackend) -> None:
        work = backend.begin_flush()
        assert work is not None
        work()

    def transient_keys(backend: RocksDBBackend) -> list[bytes]:
        with backend.writer.reading() as db:
            keys = db.keys(from_key=TRANSIENT)
            return [k for k in keys if isinstance(k, bytes) and TRANSIENT <= k < TRANSIENT_END]

    backend = RocksDBBackend()
    backend.open(tmpfs / "data")
    store = backend.open_queue("/", "q")
    for body in (b"first", b"second", b"never delivered"):
        store.push(message(body), persistent=True)
    store.push(message(b"transient", mode=1))
    flush(backend)
    for _ in range(2):
        assert isinstance(store.pop(), tuple)  # delivered, never acked
    first_epoch = backend.writer.read_u64(META_EPOCH)
    assert transient_keys(backend)
    backend.close()
    filler = fill_completely(tmpfs)

    backend = RocksDBBackend()
    backend.open(tmpfs / "data")  # read-write fails: "No space left on device"
    assert backend.writer.read_only
    assert backend.healthy  # until a write fails: nothing may need to be written
    assert not backend.needs_flush
    assert backend.writer.read_u64(META_EPOCH) == first_epoch  # the run's start waits
    store = backend.open_queue("/", "q")
    assert backend.needs_flush  # the queue's first delivery reservation
    # Messages that may have been delivered come back (flagged) while the disk is full; a
    # never-delivered one waits for a flush that can write its delivery reservation.
    popped = [store.pop(), store.pop()]
    assert [(p[1].body, p[2]) for p in popped if isinstance(p, tuple)] == [
        (b"first", True),
        (b"second", True),
    ]
    assert store.pop() is FLUSH_FIRST
    store.ack(popped[0][0])
    store.push(message(b"third"), persistent=True)
    work = backend.begin_flush()
    assert work is not None
    with pytest.raises(OSError, match="No space left"):
        work()
    assert not backend.healthy
    assert backend.writer.read_only

    filler.unlink()
    flush(backend)  # reopens read-write: the run's start, then the ack, the push, a reservation
    assert backend.healthy
    assert not backend.writer.read_only
    assert backend.writer.read_u64(META_EPOCH) == (first_epoch or 0) + 1
    assert transient_keys(backend) == []
    entry = store.pop()
    assert isinstance(entry, tuple)
    assert entry[1].body == b"never delivered"
    backend.close()

    backend = RocksDBBackend()
    backend.open(tmpfs / "data")
    store = backend.open_queue("/", "q")
    bodies = []
    while (entry := store.pop()) is not None:
        if entry is FLUSH_FIRST:
            flush(backend)
            continue
        bodies.append((entry[1].body, entry[2]))
        store.ack(entry[0])
    assert bodies == [(b"second", True), (b"never delivered", True), (b"third", False)]
    backend.close()
