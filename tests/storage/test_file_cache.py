"""The file-handle cache (``tqbroker.storage_env.filecache``): a bounded number of descriptors
for any number of log files.

- a Hypothesis state machine drives a cache with a tiny limit (writes, reads, holds, closes,
  directory moves, sheds) against a model of the files' bytes and checks the bound and the
  process's real descriptor count after every step;
- a flush in flight keeps its descriptor: a ``fdatasync`` held in a worker thread while the
  Trio-side code opens enough other files to evict everything still syncs the segment's file;
- a broker limited to 256 descriptors holds 1,000 durable queues, confirms a message in each,
  and finds every one after a restart under the same limit.

Probe of the issue: every segment kept its three descriptors for its life, so 100k durable
queues needed 300k descriptors and a declare past the limit was refused.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from pathlib import Path

import hypothesis.strategies as st
import pika
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tqbroker.backends.log.log import Log
from tqbroker.model import Message
from tqbroker.storage_env import FileSystem, StorageEnv
from tqbroker.storage_env.filecache import CachedFile, Directory, FileCache
from tqbroker.testing import start_broker_process

ON_LOG = {"x-queue-backend": "log"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fds_under(root: Path) -> int:
    """This process's descriptors of files under ``root`` (other tests' threads may open and
    close others meanwhile)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(str(root))
    return count


class CacheMachine(RuleBasedStateMachine):
    """A cache of limit 3 over up to 8 files in two directories, one of which moves."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(os.environ["TQBROKER_CACHE_MACHINE_DIR"])
        self.cache = FileCache(FileSystem(), limit=3)
        self.dirs = [Directory(self._fresh_dir()), Directory(self._fresh_dir())]
        self.files: list[CachedFile] = []
        self.model: list[bytearray] = []
        self.held: set[int] = set()
        self.closed: set[int] = set()

    def _fresh_dir(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.root))

    def _live(self) -> list[int]:
        return [i for i in range(len(self.files)) if i not in self.closed]

    @precondition(lambda self: len(self.files) < 8)
    @rule(where=st.integers(0, 1))
    def create(self, where: int) -> None:
        self.files.append(self.cache.file(self.dirs[where], f"f{len(self.files)}"))
        self.model.append(bytearray())

    @precondition(lambda self: self._live())
    @rule(data=st.data(), payload=st.binary(min_size=1, max_size=20))
    def write(self, data: st.DataObject, payload: bytes) -> None:
        i = data.draw(st.sampled_from(self._live()))
        expected = self.model[i]
        at = data.draw(st.integers(0, len(expected)))
        assert self.files[i].pwrite(payload, at) == len(payload)
        expected[at : at + len(payload)] = payload

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self._live()))
        file = self.files[i]
        assert file.size() == len(self.model[i])
        assert file.pread(100, 0) == bytes(self.model[i])

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def sync(self, data: st.DataObject) -> None:
        self.files[data.draw(st.sampled_from(self._live()))].fdatasync()

    @precondition(lambda self: len(self.held) < 4 and self._live())
    @rule(data=st.data())
    def hold(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self._live()))
        self.files[i].hold()
        self.held.add(i)

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self._live()))
        self.files[i].close()
        self.closed.add(i)
        self.held.discard(i)
        with pytest.raises(ValueError, match="is closed"):
            self.files[i].pread(1, 0)

    @rule()
    def move_directory(self) -> None:
        """Rename the first directory: its files, open or not, follow."""
        target = self.root / f"moved-{uuid.uuid4().hex}"
        self.cache.move(self.dirs[0], target)
        assert self.dirs[0].path == target

    @rule()
    def shed(self) -> None:
        self.cache.shed(0.5)

    @invariant()
    def bounded(self) -> None:
        # Held files stay open whatever the limit; the rest fit in it.
        assert self.cache.open_count <= max(3, len(self.held)) + 1
        assert fds_under(self.root) == self.cache.open_count

    def teardown(self) -> None:
        for i in self._live():
            self.files[i].close()
        assert self.cache.open_count == 0
        assert fds_under(self.root) == 0


def test_the_cache_agrees_with_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TQBROKER_CACHE_MACHINE_DIR", str(tmp_path))
    run_state_machine_as_test(
        CacheMachine, settings=settings(max_examples=60, stateful_step_count=40, deadline=None)
    )


@pytest.fixture
def tiny_env() -> StorageEnv:
    """A storage environment whose cache holds at most 4 descriptors."""
    return StorageEnv.default(file_limit=4)


def test_a_sync_in_flight_keeps_its_descriptor(
    tmp_path: Path, tiny_env: StorageEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log(tmp_path / "log", env=tiny_env)
    log.open()
    log.append(Message("", "q", b"", b"x" * 100), flags=0)
    work = log.sync_work()
    assert work is not None
    inode = os.stat(log.segments[-1].log_path).st_ino
    syncing, go_on = threading.Event(), threading.Event()
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def held_fdatasync(fd: int) -> None:
        syncing.set()
        assert go_on.wait(10)
        synced.append(os.fstat(fd).st_ino)  # the descriptor still names the segment's file
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", held_fdatasync)
    worker = threading.Thread(target=work)
    worker.start()
    assert syncing.wait(10)
    others = [tiny_env.files.file(Directory(tmp_path), f"other{n}") for n in range(8)]
    for other in others:  # each use takes a descriptor: everything idle is evicted
        other.pwrite(b"y", 0)
    assert fds_under(tmp_path) <= 4 + 1
    go_on.set()
    worker.join()
    assert synced[0] == inode
    for other in others:
        other.close()
    log.close(clean=False)


def test_a_log_reopens_its_files_after_eviction_and_a_move(
    tmp_path: Path, tiny_env: StorageEnv
) -> None:
    """Segments whose descriptors were closed read back, sync and move (the queue is deleted:
    its directory goes to the trash while a flush may be in flight) through reopened ones."""
    logs = [Log(tmp_path / f"log{n}", segment_bytes=300, env=tiny_env) for n in range(5)]
    for n, log in enumerate(logs):
        log.open()
        for i in range(10):
            log.append(Message("", "q", b"", f"{n}-{i}".encode() * 20), flags=0, hot=False)
        work = log.sync_work()
        assert work is not None
        work()
    assert fds_under(tmp_path) <= 4
    assert len(logs[0].segments) > 3
    logs[0].move(tmp_path / "trash")
    work = logs[0].sync_work()  # nothing new: the directory only, if anything
    for n, log in enumerate(logs):
        record = log.reader.read(7)
        assert record is not None
        assert record.message.body == b"%d-7" % n * 20
    logs[0].append(Message("", "q", b"", b"after the move"), flags=0)
    work = logs[0].sync_work()
    assert work is not None
    work()
    assert (tmp_path / "trash").is_dir()
    for log in logs:
        log.close(clean=False)
    assert fds_under(tmp_path) == 0


def publish_confirmed(channel: pika.adapters.blocking_connection.BlockingChannel, n: int) -> None:
    channel.queue_declare(f"q{n}", durable=True, arguments=ON_LOG)
    channel.basic_publish("", f"q{n}", b"m%d" % n, PERSISTENT)


def test_a_thousand_durable_queues_in_256_descriptors(tmp_path: Path) -> None:
    limit = 256
    queues = 1000
    with start_broker_process(
        tmp_path / "data", max_open_files=limit, stderr=tmp_path / "broker.log"
    ) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.confirm_delivery()  # each publish waits for its fsync'd confirm
        for n in range(queues):
            publish_confirmed(channel, n)
            if n % 100 == 0:
                assert open_fds(broker.proc.pid) < limit
        peak = open_fds(broker.proc.pid)
        assert peak < limit
        for n in range(0, queues, 2):  # half of them consumed
            _method, _props, body = channel.basic_get(f"q{n}", auto_ack=True)
            assert body == b"m%d" % n
        connection.close()

    with start_broker_process(
        tmp_path / "data", max_open_files=limit, stderr=tmp_path / "broker.log"
    ) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        for n in range(queues):
            _method, _props, body = channel.basic_get(f"q{n}", auto_ack=True)
            assert (body is None) == (n % 2 == 0), n
            if body is not None:
                assert body == b"m%d" % n
        assert open_fds(broker.proc.pid) < limit
        connection.close()
