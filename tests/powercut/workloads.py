"""Power-cut workloads on the ``log`` backend and the definitions file, driven in-process through
the backend's flush API (deterministic traces): a classic queue (confirmed publishes, acks,
requeues, transient messages, segment rolls, checkpoint writes, a queue delete and redeclare), a
stream (rolls, retention deletes, tracked offsets, a compaction swap) and definitions writes.

Each message body names itself (``tag-number|`` then bytes derived from both), so a checker
knows a corrupt body when it sees one.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.storage import flush
from tqbroker.backends.base import FLUSH_FIRST
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.store import LogQueueStore
from tqbroker.backends.streams import CompactionPolicy
from tqbroker.broker.definitions_file import DefinitionsFile
from tqbroker.model import Message
from tqbroker.storage_env import FileSystem, StorageEnv

from .recorder import Recorder

PERSISTENT = b"\x10\x00\x02"  # property flags: delivery-mode present; delivery-mode 2
T0 = 1_700_000_000_000


def body(tag: str, n: int) -> bytes:
    head = f"{tag}-{n:05d}|".encode()
    filler = hashlib.sha256(head).digest()
    return head + filler * (2 + (n * 7) % 23)  # 74 to 770 bytes: writes cross sectors


def ident(data: bytes) -> tuple[str, int] | None:
    """(tag, number) of an intact body; None for a corrupt one."""
    head, sep, _ = data.partition(b"|")
    try:
        tag, number = head.decode().rsplit("-", 1)
        n = int(number)
    except ValueError:
        return None
    return (tag, n) if sep and body(tag, n) == data else None


def message(tag: str, n: int, key: str = "q") -> Message:
    return Message("", key, PERSISTENT, body(tag, n), timestamp_ms=T0 + n)


def pop(store: LogQueueStore, backend: LogBackend) -> tuple[int, Message, bool] | None:
    for _ in range(3):
        got = store.pop()
        if got is not FLUSH_FIRST:
            return got
        flush(backend)
    raise AssertionError("the queue kept asking for a flush")


def drain(store: LogQueueStore, backend: LogBackend) -> list[bytes]:
    bodies = []
    while (got := pop(store, backend)) is not None:
        bodies.append(got[1].body)
    return bodies


def union(marks: list[dict[str, Any]], key: str) -> set[Any]:
    out: set[Any] = set()
    for mark in marks:
        out.update(mark.get(key, ()))
    return out


def relaxed(found: Counter[str], fsync: str) -> Counter[str]:
    """Under the ``interval`` and ``never`` policies a power cut may lose confirmed messages
    and acks (that is what they trade): only a failed start, a corrupt body, a duplicate and
    (streams) a record other than the one appended at its offset still count."""
    if fsync != "batch":
        for kind in ("lost", "resurrected"):
            found.pop(kind, None)
    return found


class QueueWorkload:
    def __init__(self, rounds: int = 10, *, fsync: str = "batch") -> None:
        self.rounds = rounds
        self.fsync = fsync
        self.name = "classic-queue" + ("" if fsync == "batch" else f" (fsync {fsync})")

    def backend(self) -> LogBackend:
        return LogBackend(segment_bytes=2048, index_interval_bytes=256, fsync=self.fsync)

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(recorder))
        queue = backend.open_queue("/", "q")
        n = 0
        held: list[tuple[int, int]] = []  # (offset, number): acked a round late, out of order
        for _ in range(self.rounds):
            confirmed, acked = [], []
            for offset, number in held:
                queue.ack(offset)
                acked.append(number)
            held = []
            for _ in range(5):
                persistent = n % 4 != 3
                queue.push(message("q", n), persistent=persistent)
                if persistent:
                    confirmed.append(n)
                n += 1
            for _ in range(6):
                got = pop(queue, backend)
                if got is None:
                    break
                found = ident(got[1].body)
                assert found is not None
                if found[1] % 3 == 0 and not got[2]:  # requeued once, acked next time
                    queue.requeue(got[0])
                elif found[1] % 7 == 5:
                    held.append((got[0], found[1]))
                else:
                    queue.ack(got[0])
                    acked.append(found[1])
            recorder.mark(acking=acked)  # may be durable from now on; promised after the flush
            flush(backend)
            recorder.mark(confirmed=confirmed, acked=acked)
        deleted = backend.open_queue("/", "d")
        for i in range(4):
            deleted.push(message("d", i), persistent=True)
        flush(backend)
        recorder.mark(confirmed_d=list(range(4)))
        recorder.mark(deleting_d=[True])
        backend.delete_queue("/", "d")
        flush(backend)
        recorder.mark(deleted_d=[True])
        again = backend.open_queue("/", "d")
        for i in range(3):
            again.push(message("e", i), persistent=True)
        flush(backend)
        recorder.mark(confirmed_e=list(range(3)))
        backend.close()

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        found: Counter[str] = Counter()
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(fs))
        try:
            got_q = drain(backend.open_queue("/", "q"), backend)
            got_d = drain(backend.open_queue("/", "d"), backend)
        finally:
            backend.close()
        seen: Counter[tuple[str, int]] = Counter()
        for data in got_q + got_d:
            who = ident(data)
            if who is None:
                found["corrupt"] += 1
            else:
                seen[who] += 1
        found["duplicated"] += sum(c - 1 for c in seen.values() if c > 1)
        confirmed, acked = union(marks, "confirmed"), union(marks, "acked")
        q_ids = {n for (tag, n) in seen if tag == "q"}
        found["lost"] += len(confirmed - union(marks, "acking") - q_ids)
        found["resurrected"] += len(q_ids & acked)
        found["unexpected"] += sum(1 for n in q_ids if n % 4 == 3)  # transient: gone
        d_ids = {n for (tag, n) in seen if tag == "d"}
        if union(marks, "deleted_d"):
            found["resurrected"] += len(d_ids)
        elif not union(marks, "deleting_d"):
            found["lost"] += len(union(marks, "confirmed_d") - d_ids)
        e_ids = {n for (tag, n) in seen if tag == "e"}
        found["lost"] += len(union(marks, "confirmed_e") - e_ids)
        return relaxed(found, self.fsync)


def _key(message: Message) -> bytes:
    return message.routing_key.encode()


COMPACT = CompactionPolicy(_key, tombstone_grace_ms=0)


class StreamWorkload:
    def __init__(self, rounds: int = 12, *, fsync: str = "batch") -> None:
        self.rounds = rounds
        self.fsync = fsync
        self.name = "stream" + ("" if fsync == "batch" else f" (fsync {fsync})")

    def backend(self) -> LogBackend:
        return LogBackend(segment_bytes=3072, index_interval_bytes=512, fsync=self.fsync)

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(recorder))
        stream = backend.open_stream("/", "s")
        keys: dict[int, str] = {}  # offset -> key
        n = 0
        for r in range(self.rounds):
            appended = {}
            for _ in range(5):
                key = f"k{n % 3}" if n % 2 else f"u{n}"  # half the keys are unique
                offset = stream.append(message("s", n, key=key))
                appended[offset] = n
                keys[offset] = key
                n += 1
            recorder.mark(appended=appended)
            flush(backend)
            recorder.mark(confirmed=list(appended.items()))
            if r % 3 == 2:
                stream.store_offset("c1", offset + 1)
                flush(backend)
                recorder.mark(tracked=[offset + 1])
            if r == 4:
                stream.apply_retention(max_bytes=7000, max_age_ms=None, now_ms=int(time.time()))
                recorder.mark(retention_from=[stream.first_offset])
                flush(backend)
            if r in (7, 11):
                work = stream.compaction_work(COMPACT, T0)
                if work is not None:
                    result = work()
                    latest = {key: offset for offset, key in sorted(keys.items())}
                    recorder.mark(superseded=[o for o, k in keys.items() if latest[k] != o])
                    stream.finish_compaction(result)
                    flush(backend)
        backend.close()

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        found: Counter[str] = Counter()
        appended: dict[int, int] = {}
        for mark in marks:
            appended.update(mark.get("appended", {}))
        confirmed = dict(union(marks, "confirmed"))
        retention_from = max(union(marks, "retention_from"), default=0)
        superseded = union(marks, "superseded")
        tracked = max(union(marks, "tracked"), default=0)
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(fs))
        try:
            stream = backend.open_stream("/", "s")
            for offset, n in confirmed.items():
                record = stream.read(offset)
                if record is None:
                    if offset >= retention_from and offset not in superseded:
                        found["lost"] += 1
                elif record.message.body != body("s", n):
                    found["corrupt"] += 1
            offset = stream.first_offset
            while (record := stream.read_from(offset)) is not None:
                n_at = appended.get(record.offset)
                if n_at is None or record.message.body != body("s", n_at):
                    found["corrupt" if ident(record.message.body) is None else "unexpected"] += 1
                offset = record.offset + 1
            if stream.offsets.get("c1", 0) < tracked:
                found["lost"] += 1
        finally:
            backend.close()
        return relaxed(found, self.fsync)


class DefinitionsWorkload:
    name = "definitions"

    def __init__(self, versions: int = 6) -> None:
        self.versions = versions

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        version = 0

        def snapshot() -> bytes:
            # A definitions document: its one vhost names the version.
            queues = [{"name": f"queue-{i}", "vhost": f"v{version}"} for i in range(version * 40)]
            document = {"vhosts": [{"name": f"v{version}"}], "queues": queues}
            return json.dumps(document).encode()

        file = DefinitionsFile(data_dir, snapshot, StorageEnv.default(recorder))
        for version in range(1, self.versions + 1):
            file.changed()
            work = file.begin_flush()
            assert work is not None
            work()
            recorder.mark(definitions=[version])

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        found: Counter[str] = Counter()
        try:
            loaded = DefinitionsFile(data_dir, bytes, StorageEnv.default(fs)).load()
        except ValueError:  # DefinitionsError: not the JSON written
            found["corrupt"] += 1
            return found
        (vhost,) = loaded.get("vhosts", ["v0"])
        version = int(vhost[1:])
        if version < max(union(marks, "definitions"), default=0):
            found["lost"] += 1
        queues = loaded["definitions"][vhost]["queues"] if loaded else []
        if [q["name"] for q in queues] != [f"queue-{i}" for i in range(version * 40)]:
            found["corrupt"] += 1
        return found
