"""A power-cut workload for the replication primitives of a stream on the ``log`` backend: a
follower copies its leader's frames (``append_frames``, across segments and two leader
epochs), cuts its log back where it diverged (``truncate``) and, as the new leader, begins
an epoch and appends records of its own.

After recovery from any crash state the follower's log must be the old one or the truncated
one (offsets without a hole; once ``truncate`` returned, no record at or past its offset
from before it), lose no confirmed record, hold each record appended at its offset and keep
an epoch history that matches its records, and its replica id.

``RestartWorkload``: a follower copies its leader, then is emptied and continued further on
under a new replica id (``begin_restart``: a damaged replica copied anew) and appends there.
After recovery its log is the old one (every confirmed record, its old id) or the restarted
one (none of the old records, its start at the new offset, a new id, every record appended
there and confirmed), never a mix.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.storage import flush
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.stream import LogStream
from tqbroker.backends.streams import truncate
from tqbroker.storage_env import FileSystem, StorageEnv

from .recorder import Recorder
from .workloads import body, ident, message, union


def copy_rounds(backend: LogBackend, recorder: Recorder, rounds: int) -> LogStream:
    """A leader takes four records a round (epoch 1, then 2 from half way), and a follower
    copies each round; returns the follower."""
    leader, follower = backend.open_stream("/", "l"), backend.open_stream("/", "f")
    assert isinstance(leader, LogStream)
    assert isinstance(follower, LogStream)
    n = 0
    for r in range(rounds):
        epoch = 1 if r < rounds // 2 else 2
        leader.begin_epoch(epoch)
        appended = {}
        for _ in range(4):
            appended[leader.append(message("a", n))] = n
            leader.seal()  # one frame per record: any offset is a frame boundary
            n += 1
        flush(backend)
        recorder.mark(appending=appended)
        _replicate(follower, leader, epoch)
        flush(backend)
        recorder.mark(confirmed=list(appended.items()), replica=[follower.replica_id])
    return follower


def lead_epoch_3(backend: LogBackend, recorder: Recorder, follower: LogStream) -> None:
    """The follower, leading now, begins epoch 3 and takes six records of its own."""
    follower.begin_epoch(3)
    recorder.mark(epoch3=[True])
    appended = {}
    for i in range(6):
        appended[follower.append(message("b", i))] = i
    recorder.mark(appending_b=appended)
    flush(backend)
    recorder.mark(confirmed_b=list(appended.items()))


def _replicate(follower: LogStream, leader: LogStream, epoch: int) -> None:
    position = follower.next_offset
    while position < leader.durable_end:
        frames, position = leader.read_frames(position, leader.durable_end, 600)
        follower.append_frames(frames, epoch)


class ReplicaWorkload:
    name = "stream replica"

    def __init__(self, rounds: int = 8, cut: int = 13) -> None:
        self.rounds = rounds
        self.cut = cut  # where the follower diverged (a frame boundary: runs of one record)

    def backend(self) -> LogBackend:
        return LogBackend(segment_bytes=2048, index_interval_bytes=256)

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(recorder))
        follower = copy_rounds(backend, recorder, self.rounds)
        recorder.mark(truncating=[self.cut])
        truncate(follower, self.cut)
        recorder.mark(truncated=[self.cut])
        lead_epoch_3(backend, recorder, follower)
        backend.close()

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        found: Counter[str] = Counter()
        cut = self.cut
        appended: dict[int, int] = {}
        appended_b: dict[int, int] = {}
        for mark in marks:
            appended.update(mark.get("appending", {}))
            appended_b.update(mark.get("appending_b", {}))
        confirmed, confirmed_b = dict(union(marks, "confirmed")), dict(union(marks, "confirmed_b"))
        truncating, truncated = bool(union(marks, "truncating")), bool(union(marks, "truncated"))
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(fs))
        try:
            follower = backend.open_stream("/", "f")
            records = follower.read_many(0, 1 << 40, 1 << 20)
            history = list(follower.epoch_history)
            if union(marks, "replica") - {follower.replica_id}:
                found["unexpected"] += 1  # a replica id written once, kept
            end = follower.next_offset
        finally:
            backend.close()
        offsets = [r.offset for r in records]
        if offsets and offsets[-1] + 1 != end:
            found["unexpected"] += 1  # the log ends past its last record: a hole at the end
        old_past_cut = []
        for record in records:
            who = ident(record.message.body)
            if who is None:
                found["corrupt"] += 1
            elif who[0] == "a" and appended.get(record.offset) == who[1]:
                if record.offset >= cut:
                    old_past_cut.append(record.offset)
            elif who[0] == "b" and appended_b.get(record.offset) == who[1]:
                if record.message.body != body("b", who[1]):
                    found["corrupt"] += 1
            else:
                found["unexpected"] += 1
        if truncated and old_past_cut:
            found["resurrected"] += len(old_past_cut)
        held = set(offsets)
        tail = {o for o in confirmed if o >= cut}
        if not truncating:
            found["lost"] += len(set(confirmed) - held)
        else:  # the old log (every confirmed record) or the truncated one (none past the cut)
            found["lost"] += len({o for o in confirmed if o < cut} - held)
            if old_past_cut and not tail <= set(old_past_cut):
                found["lost"] += 1  # part of the old tail: a mix
        found["lost"] += len(set(confirmed_b) - held)
        # The epoch history matches the records: (1, 0) from the first frame copied, (2, 16)
        # while a record of epoch 2 is there, (3, cut) once a record of epoch 3 is.
        epoch2_at = 4 * (self.rounds // 2)
        epochs = dict(history)
        if records and epochs.get(1) != 0:
            found["lost"] += 1
        if any(o >= epoch2_at for o in old_past_cut) and epochs.get(2) != epoch2_at:
            found["lost"] += 1
        if any(who == "b" for who in _tags(records)) and history[-1:] != [(3, cut)]:
            found["lost"] += 1
        if any(start > end for _epoch, start in history):
            found["unexpected"] += 1
        if truncated and 2 in epochs:
            found["resurrected"] += 1  # an epoch past the cut came back
        return found


def _tags(records: list[Any]) -> list[str]:
    tags = []
    for record in records:
        who = ident(record.message.body)
        if who is not None:
            tags.append(who[0])
    return tags


class RestartWorkload(ReplicaWorkload):
    name = "stream replica restart"

    def __init__(self, rounds: int = 6, start: int = 100) -> None:
        super().__init__(rounds)
        self.start = start  # past the copied records' end

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(recorder))
        follower = copy_rounds(backend, recorder, self.rounds)
        recorder.mark(restarting=[self.start])
        for step in follower.begin_restart(self.start, new_identity=True):
            step()
        recorder.mark(restarted=[self.start])
        lead_epoch_3(backend, recorder, follower)
        backend.close()

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        found: Counter[str] = Counter()
        appended_b: dict[int, int] = {}
        for mark in marks:
            appended_b.update(mark.get("appending_b", {}))
        confirmed, confirmed_b = dict(union(marks, "confirmed")), dict(union(marks, "confirmed_b"))
        restarting, restarted = bool(union(marks, "restarting")), bool(union(marks, "restarted"))
        old_ids = union(marks, "replica")
        backend = self.backend()
        backend.open(data_dir, StorageEnv.default(fs))
        try:
            follower = backend.open_stream("/", "f")
            records = follower.read_many(0, 1 << 40, 1 << 20)
            history = list(follower.epoch_history)
            replica_id, first, end = (
                follower.replica_id,
                follower.first_offset,
                follower.next_offset,
            )
        finally:
            backend.close()
        held = {r.offset for r in records}
        tags = _tags(records)
        if len(tags) != len(records):
            found["corrupt"] += 1
        old = [r.offset for r in records if (ident(r.message.body) or ("",))[0] == "a"]
        if old or not restarting or end < self.start:  # the old log: whole, its id, nothing new
            found["lost"] += len(set(confirmed) - held)
            if "b" in tags or end >= self.start:
                found["unexpected"] += 1  # a mix of the old log and the restarted one
            if old_ids and replica_id not in old_ids:
                found["unexpected"] += 1
            if restarted:
                found["resurrected"] += 1  # the restart returned: the old log must not be back
        else:  # the restarted one: from its start, a new id, what was confirmed there
            if first != self.start or replica_id in old_ids:
                found["unexpected"] += 1
            found["lost"] += len(set(confirmed_b) - held)
            for record in records:
                who = ident(record.message.body)
                if who is None or appended_b.get(record.offset) != who[1]:
                    found["unexpected"] += 1
            if held and (min(held) != self.start or max(held) + 1 != end):
                found["unexpected"] += 1
            if history not in ([], [(3, self.start)]) or ("b" in tags and not history):
                found["lost"] += 1
        return found
