"""Directories the broker creates are durable entries: each new directory's parent is fsync'd
(``StorageEnv.make_dirs``), so a power cut cannot lose a data directory, or RocksDB's database
in it, with everything confirmed inside."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tqbroker.storage_env import FileSystem, StorageEnv

from .broker_workload import BrokerWorkload
from .harness import explore
from .recorder import Op, Recorder


def recording(root: Path) -> Recorder:
    root.mkdir()
    return Recorder(root)


def assert_created_durably(ops: list[Op], names: list[str]) -> None:
    """Each directory in ``names`` is created, then its parent fsync'd."""
    created = [(i, op) for i, op in enumerate(ops) if op[0] == "create" and op[4] == "d"]
    assert [op[2] for _i, op in created] == names
    for i, op in created:
        assert ("dsync", op[1]) in ops[i + 1 :], f"{op[2]}'s entry in its parent is never synced"


def test_make_dirs_syncs_the_parent_of_each_directory_it_creates(tmp_path: Path) -> None:
    recorder = recording(tmp_path / "root")
    env = StorageEnv.default(recorder)
    env.make_dirs(recorder.root / "a" / "b" / "c")
    env.make_dirs(recorder.root / "a" / "b" / "c")  # there already: nothing to do
    assert (recorder.root / "a" / "b" / "c").is_dir()
    assert_created_durably(recorder.ops, ["a", "b", "c"])
    assert len(recorder.ops) == 6


def test_the_rocksdb_directory_entry_is_made_durable(tmp_path: Path) -> None:
    """RocksDB fsyncs its own directory, not the entry of that directory in the data
    directory: the backend does."""
    pytest.importorskip("tqbroker_rocksdb")
    from tqbroker_rocksdb import RocksDBBackend

    recorder = recording(tmp_path / "data")
    backend = RocksDBBackend()
    backend.open(recorder.root, StorageEnv.default(recorder))
    backend.close()
    assert_created_durably(recorder.ops, ["rocksdb"])


class NestedDataDirectory(BrokerWorkload):
    """The broker workload with a data directory that does not exist yet (two levels below the
    recorded directory): the broker creates it."""

    name = "broker+pika, data directory created by the broker"

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        super().run(data_dir / "var" / "tqbroker", recorder)

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        return super().check(data_dir / "var" / "tqbroker", marks, fs)


def test_power_cuts_do_not_lose_a_data_directory_the_broker_created(tmp_path: Path) -> None:
    """Without the fsync of the new data directory's parent, every crash state that drops the
    pending entries (the ``synced`` variant) loses the data directory and every confirmed
    message (and the creates would not be in the trace at all without the facade)."""
    logging.disable(logging.WARNING)
    try:
        report = explore(NestedDataDirectory(messages=4), tmp_path, points=4, seed=1)
    finally:
        logging.disable(logging.NOTSET)
    assert report.ok, f"{report}\n" + "\n".join(report.examples)
    assert report.states >= 10
