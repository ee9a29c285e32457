"""A new durable queue costs nothing on disk at its declare: its existence is the definitions
file's (one write covers every declare made meanwhile); its directory and files are created by
its first write and made durable by the flush that syncs it (``log/`` once per flush for all the
queues created since). A definitions import of 10,000 durable queues paid about four fsyncs and
six creates a queue (49 s).

Counted on the recording file system (``Recorder``), then checked by power cuts: every queue
whose ``declare-ok`` or import answer was received survives, empty or with every message
confirmed in it, and takes publishes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import cbor2
import httpx
import pika
import pytest

from tests.support.storage import flush
from tqbroker.backends.base import FLUSH_FIRST
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.store import STATE_FILE
from tqbroker.storage_env import StorageEnv
from tqbroker.testing import running_broker

from .declare_workload import ON_LOG, PERSISTENT, DeclareWorkload, config, definitions
from .harness import explore
from .recorder import Op, Recorder
from .workloads import body, message

SYNCS = ("fsync", "dsync")


@pytest.fixture(autouse=True)
def quiet_recovery() -> Iterator[None]:
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def recorded(data_dir: Path) -> Recorder:
    data_dir.mkdir()
    return Recorder(data_dir)


def paths(ops: list[Op]) -> dict[int, str]:
    """The path (from the data directory) of every file and directory the trace created."""
    parents: dict[int, tuple[int, str]] = {}
    for op in ops:
        if op[0] == "create":
            parents[op[3]] = (op[1], op[2])
        elif op[0] == "rename":  # follow a moved entry
            for ident, (parent, name) in list(parents.items()):
                if (parent, name) == (op[1], op[2]):
                    parents[ident] = (op[3], op[4])

    def path(ident: int) -> str:
        if ident == 0:
            return "."
        parent, name = parents[ident]
        return name if parent == 0 else f"{path(parent)}/{name}"

    return {ident: path(ident) for ident in [0, *parents]}


def synced(ops: list[Op], start: int, end: int | None = None) -> list[str]:
    """What was fsync'd (files) or dsync'd (directories) among ``ops[start:end]``."""
    named = paths(ops)
    return [named[op[1]] for op in ops[start:end] if op[0] in SYNCS]


def test_opening_new_queues_writes_nothing_until_records_are_flushed(tmp_path: Path) -> None:
    recorder = recorded(tmp_path / "data")
    backend = LogBackend()
    backend.open(recorder.root, StorageEnv.default(recorder))
    start = len(recorder.ops)
    stores = [backend.open_queue("/", f"q{n}") for n in range(100)]
    # Not a file created (it was 6 creates and 3 fsyncs a queue: log/, state.cbor, its dir).
    assert recorder.ops[start:] == []
    flush(backend)
    assert recorder.ops[start:] == []  # (and 1 fsync more a queue at the next flush: its dir)
    stores[7].push(message("q", 0), persistent=True)
    before = len(recorder.ops)
    flush(backend)
    directory = stores[7].directory.name
    # The entries the first confirm depends on, once for all queues: the data directory's
    # (log/), log/'s (the queues' directories), the queue's (its segment and checkpoint); then
    # the record and the checkpoint with the queue's first delivery window.
    first_flush = [".", "log", f"log/{directory}", f"log/{directory}"]
    first_flush += [f"log/{directory}/00000000000000000000.log", f"log/{directory}/state.cbor"]
    assert sorted(synced(recorder.ops, before)) == sorted(first_flush)
    stores[8].push(message("q", 1), persistent=True)
    before = len(recorder.ops)
    flush(backend)
    directory = stores[8].directory.name
    first_flush = ["log", f"log/{directory}", f"log/{directory}"]  # created by that first write
    first_flush += [f"log/{directory}/00000000000000000000.log", f"log/{directory}/state.cbor"]
    assert sorted(synced(recorder.ops, before)) == sorted(first_flush)
    stores[8].push(message("q", 2), persistent=True)
    before = len(recorder.ops)
    flush(backend)
    assert synced(recorder.ops, before) == [f"log/{directory}/00000000000000000000.log"]
    backend.close()


def test_a_new_queue_delivers_at_once_and_its_first_flush_writes_its_window(
    tmp_path: Path,
) -> None:
    """Nothing is written at open, yet the first pop needs no flush: until the queue's first
    checkpoint is on disk a recovery takes every record for delivered. Its first push asks
    the next flush for that checkpoint."""
    backend = LogBackend()
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    store.push(message("q", 0), persistent=True)
    popped = store.pop()
    assert popped is not None
    assert popped is not FLUSH_FIRST
    assert popped[2] is False
    assert not (store.directory / STATE_FILE).exists()
    flush(backend)
    assert cbor2.loads((store.directory / STATE_FILE).read_bytes())["delivered"] > 0
    backend.close()


def test_records_of_a_new_queue_without_a_checkpoint_come_back_redelivered(
    tmp_path: Path,
) -> None:
    """A crash kept a new queue's records but not its first checkpoint (written after them,
    by the same flush): they may have been delivered, so they come back flagged so."""
    backend = LogBackend()
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    store.push(message("q", 0), persistent=True)
    assert store.pop() is not None  # delivered, no checkpoint on disk
    store.log.write_out()
    store.log.close(clean=False)  # a crash: the records are in the file, nothing else
    backend = LogBackend()
    backend.open(tmp_path)
    store = backend.open_queue("/", "q")
    popped = store.pop()
    assert popped is not None
    assert popped is not FLUSH_FIRST
    assert popped[1].body == message("q", 0).body
    assert popped[2] is True
    backend.close()


def test_declares_and_an_import_sync_nothing_under_log(tmp_path: Path) -> None:
    """Through the broker: a ``queue.declare`` and an import of 200 queues with their bindings
    sync nothing of the log backend's; what they sync is the definitions file, a few writes for
    the lot (it was about 5 fsyncs a queue)."""
    recorder = recorded(tmp_path / "data")
    queues = [f"i{n}" for n in range(200)]
    with running_broker(config(recorder.root), env=StorageEnv.default(recorder)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        start = len(recorder.ops)
        channel.queue_declare("d0", durable=True, arguments=ON_LOG)
        declared = len(recorder.ops)
        with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as api:
            api.post("/api/definitions", json=definitions(queues)).raise_for_status()
        imported = len(recorder.ops)
        channel.confirm_delivery()
        channel.basic_publish("", "d0", body("d0", 0), PERSISTENT, mandatory=True)
        connection.close()
        ops = list(recorder.ops)
    on_declare, on_import = synced(ops, start, declared), synced(ops, declared, imported)
    assert [p for p in on_declare + on_import if p.startswith("log")] == []
    definitions_file = {".", "definitions.json"}  # its temporary file, renamed; its directory
    assert set(on_declare) <= definitions_file
    assert set(on_import) <= definitions_file
    assert len(on_import) <= 40, f"{len(on_import)} syncs for an import of 200 queues"
    # The first confirm in d0 made its directory's entries durable.
    confirmed = synced(ops, imported)
    assert "log" in confirmed
    assert any(p.endswith(".log") for p in confirmed)


def test_power_cuts_after_declares_and_an_import(tmp_path: Path) -> None:
    """Crash points right after each ``declare-ok``, the import's answer and the confirms,
    and a sample of the others."""
    report = explore(DeclareWorkload(), tmp_path, points=14)
    assert report.ok, f"{report}\n" + "\n".join(report.examples)
    assert report.states >= 40


@pytest.mark.slow
def test_power_cuts_after_declares_and_an_import_many(tmp_path: Path) -> None:
    report = explore(DeclareWorkload(declared=4, imported=60, messages=4), tmp_path, points=60)
    assert report.ok, f"{report}\n" + "\n".join(report.examples)
    assert report.states >= 200
