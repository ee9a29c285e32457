"""Bugs the power-cut simulation found in the ``log`` backend, each pinned by the trace of the
operation that had it (``Recorder``): what must be durable before what."""

from __future__ import annotations

from pathlib import Path

from tests.support.storage import flush
from tqbroker.backends.log import LogBackend
from tqbroker.storage_env import StorageEnv

from .recorder import Recorder
from .workloads import message


def recorded(data_dir: Path) -> Recorder:
    data_dir.mkdir()
    return Recorder(data_dir)


def test_a_new_queue_directory_entry_is_made_durable(tmp_path: Path) -> None:
    """A queue's directory was created and never its parent fsync'd: its segments' entries were
    durable, the directory's not, so a power cut could lose the queue whole with every
    confirmed message in it."""
    recorder = recorded(tmp_path / "data")
    backend = LogBackend()
    backend.open(recorder.root, StorageEnv.default(recorder))
    queue = backend.open_queue("/", "q")
    queue.push(message("q", 0), persistent=True)
    flush(backend)
    recorder.mark(confirmed=[0])
    backend.close()
    ops = recorder.ops
    confirmed = ops.index(("mark", {"confirmed": [0]}))
    created = [(i, op) for i, op in enumerate(ops) if op[0] == "create" and op[4] == "d"]
    assert next(op[2] for _i, op in created) == "log"
    for i, op in created:  # log/, then the queue's directory
        assert ("dsync", op[1]) in ops[i + 1 : confirmed], (
            f"{op[2]}'s entry in its parent is not synced before the first confirm"
        )


def test_a_retention_only_flush_syncs_the_stream_checkpoint_before_renaming_it(
    tmp_path: Path,
) -> None:
    """A flush that only applied retention wrote stream.cbor without an fsync and renamed it
    over the durable one: a power cut could keep the rename and not the bytes, and the empty
    stream.cbor lost every stored consumer offset."""
    recorder = recorded(tmp_path / "data")
    backend = LogBackend(segment_bytes=1024)
    backend.open(recorder.root, StorageEnv.default(recorder))
    stream = backend.open_stream("/", "s")
    for n in range(20):
        stream.append(message("s", n))
    stream.store_offset("c1", 7)
    flush(backend)
    start = len(recorder.ops)
    assert stream.apply_retention(max_bytes=1500, max_age_ms=None, now_ms=0)
    flush(backend)
    backend.close()
    ops = recorder.ops[start:]
    tmp = next(op[3] for op in ops if op[0] == "create" and op[2] == "stream.cbor.tmp")
    rename = next(i for i, op in enumerate(ops) if op[0] == "rename" and op[2] == "stream.cbor.tmp")
    assert ("fsync", tmp) in ops[:rename], "stream.cbor renamed into place unsynced"
