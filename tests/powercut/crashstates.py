"""From a recorded trace, the disk states a power cut could leave (CrashMonkey/ALICE style).

At a crash point (after the first ``k`` operations of the trace):
- a file's data is durable up to its last ``fsync`` (writes and truncates before it); later
  ones are *pending*;
- a directory entry change (create, rename, unlink) is durable once a directory it touches has
  been fsync'd after it (a rename between two directories is one journaled change: either
  directory's fsync makes it durable); later ones are pending. A new file's entry is durable
  only that way: a file fsync'd but not its directory may be lost whole;
- the pending operations are each dropped or kept by a *variant*: ``synced`` (all dropped),
  ``all`` (all kept: what a killed process leaves), ``zeroed`` (entries kept, pending writes
  become zeros: the size reached the disk, the data did not), ``torn`` (the last pending write
  of each file keeps only its first 512-byte sectors), ``hole<j>`` (it misses its sector
  ``j`` instead, never its last: damage that often only a checksum shows), ``prefix`` (the
  pending operations in order up to a random point: an ordered journal) and ``reorder`` (each
  entry change and each 512-byte sector of each pending write kept or not at random).

``crash_states`` yields ``CrashState``s (deduplicated by content); ``crash_state`` is the one
state at one point in one variant (a power cut at a moment the test chose); ``materialize``
writes one into a directory.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .recorder import Op

SECTOR = 512
VARIANTS = (
    *("synced", "all", "zeroed", "torn", "hole0", "hole1", "hole2"),
    *("prefix", "reorder1", "reorder2"),
)
NAMESPACE = ("create", "rename", "unlink")
DATA = ("write", "trunc")


@dataclass
class CrashState:
    point: int  # operations before the crash
    variant: str
    marks: list[dict[str, Any]]  # what the workload was promised before the crash
    dirs: dict[int, dict[str, int]] = field(default_factory=dict)
    files: dict[int, bytes] = field(default_factory=dict)

    def tree(self) -> dict[str, bytes | None]:
        """Path -> content (None: a directory), of everything reachable from the root."""
        out: dict[str, bytes | None] = {}

        def walk(ident: int, prefix: str) -> None:
            for name, child in sorted(self.dirs.get(ident, {}).items()):
                path = f"{prefix}{name}"
                if child in self.dirs:
                    out[path] = None
                    walk(child, path + "/")
                else:
                    out[path] = self.files.get(child, b"")

        walk(0, "")
        return out

    def digest(self) -> str:
        h = hashlib.sha256()
        for path, content in self.tree().items():
            h.update(path.encode() + b"\0")
            h.update(b"D" if content is None else b"F" + hashlib.sha256(content).digest())
        return h.hexdigest()


def materialize(state: CrashState, target: Path) -> None:
    for path, content in state.tree().items():
        if content is None:
            (target / path).mkdir()
        else:
            (target / path).write_bytes(content)


def _pieces(offset: int, data: bytes) -> list[tuple[int, bytes]]:
    """A write split at 512-byte sector boundaries of the file."""
    out = []
    pos = offset
    while pos < offset + len(data):
        end = min((pos // SECTOR + 1) * SECTOR, offset + len(data))
        out.append((pos, data[pos - offset : end - offset]))
        pos = end
    return out


def _write(content: bytearray, offset: int, data: bytes) -> None:
    if len(content) < offset:
        content.extend(bytes(offset - len(content)))
    content[offset : offset + len(data)] = data


def _state(ops: Sequence[Op], point: int, variant: str, rng: random.Random) -> CrashState:
    last_fsync: dict[int, int] = {}
    last_dsync: dict[int, int] = {}
    for i, op in enumerate(ops[:point]):
        if op[0] == "fsync":
            last_fsync[op[1]] = i
        elif op[0] == "dsync":
            last_dsync[op[1]] = i

    def durable(i: int, op: Op) -> bool:
        if op[0] in DATA:
            return i < last_fsync.get(op[1], -1)
        touched = (op[1], op[3]) if op[0] == "rename" else (op[1],)
        return any(i < last_dsync.get(d, -1) for d in touched)

    pending = [i for i, op in enumerate(ops[:point]) if op[0] in NAMESPACE + DATA]
    pending = [i for i in pending if not durable(i, ops[i])]
    keep_upto = rng.randint(0, len(pending)) if variant == "prefix" else 0
    prefix_kept = set(pending[:keep_upto])
    last_write: dict[int, int] = {}
    for i in pending:
        if ops[i][0] == "write":
            last_write[ops[i][1]] = i
    pending_set = set(pending)
    state = CrashState(point, variant, [op[1] for op in ops[:point] if op[0] == "mark"])
    state.dirs[0] = {}
    contents: dict[int, bytearray] = {}
    for i, op in enumerate(ops[:point]):
        kind = op[0]
        if kind not in NAMESPACE + DATA:
            continue
        is_pending = i in pending_set
        if kind in NAMESPACE:
            if is_pending and not (
                variant in ("all", "zeroed", "torn")
                or variant.startswith("hole")
                or (variant == "prefix" and i in prefix_kept)
                or (variant.startswith("reorder") and rng.random() < 0.5)
            ):
                continue
            if kind == "create":
                _, parent, name, ident, what = op
                if what == "d":
                    state.dirs.setdefault(ident, {})
                else:
                    contents.setdefault(ident, bytearray())
                state.dirs.setdefault(parent, {})[name] = ident
            elif kind == "rename":
                _, sdir, sname, ddir, dname = op
                moved = state.dirs.get(sdir, {}).pop(sname, None)
                if moved is not None:
                    state.dirs.setdefault(ddir, {})[dname] = moved
            else:
                state.dirs.get(op[1], {}).pop(op[2], None)
            continue
        content = contents.setdefault(op[1], bytearray())
        if kind == "trunc":
            if is_pending and variant in ("synced",):
                continue
            if is_pending and variant == "prefix" and i not in prefix_kept:
                continue
            if is_pending and variant.startswith("reorder") and rng.random() < 0.5:
                continue
            del content[op[2] :]
            continue
        _, ident, offset, data = op
        if not is_pending or variant == "all":
            _write(content, offset, data)
        elif variant == "zeroed":
            _write(content, offset, bytes(len(data)))
        elif variant == "torn":
            pieces = _pieces(offset, data)
            if i == last_write[ident]:
                pieces = pieces[: rng.randint(0, len(pieces) - 1)] if len(pieces) > 1 else []
            for at, piece in pieces:
                _write(content, at, piece)
        elif variant.startswith("hole"):
            pieces = _pieces(offset, data)
            hole = int(variant[4:])
            if i == last_write[ident] and hole < len(pieces) - 1:
                del pieces[hole]
            for at, piece in pieces:
                _write(content, at, piece)
        elif variant == "prefix":
            if i in prefix_kept:
                _write(content, offset, data)
        elif variant.startswith("reorder"):
            for at, piece in _pieces(offset, data):
                if rng.random() < 0.5:
                    _write(content, at, piece)
    state.files = {ident: bytes(c) for ident, c in contents.items()}
    return state


def crash_state(
    ops: Sequence[Op], point: int | None = None, variant: str = "synced", seed: int = 0
) -> CrashState:
    """The disk a power cut after the first ``point`` operations (None: all of them) leaves,
    in ``variant`` (``synced``: every pending operation dropped)."""
    return _state(ops, len(ops) if point is None else point, variant, random.Random(seed))


COMMON_MARKS = {"confirmed", "appended", "acking", "deleting", "deleting_d"}


def crash_points(ops: Sequence[Op], limit: int | None, seed: int = 0, start: int = 0) -> list[int]:
    """Every point right before and after each durability operation, directory change and
    mark. With a ``limit``: the ends, the points right after the rarer promises (a queue
    declared or deleted, acks, definitions: the moment a power cut tests them hardest), then a
    random sample of the others."""
    interesting = {start, len(ops)}
    for i, op in enumerate(ops):
        if op[0] in ("fsync", "dsync", "rename", "unlink", "mark") and i >= start:
            interesting.update((i, i + 1))
    points = sorted(interesting)
    if limit is None or len(points) <= limit:
        return points
    rare = [i + 1 for i, op in enumerate(ops) if op[0] == "mark" and set(op[1]) - COMMON_MARKS]
    chosen = {start, len(ops), *rare[: max(0, limit - 2)]}
    rest = [point for point in points if point not in chosen]
    chosen.update(random.Random(seed).sample(rest, max(0, limit - len(chosen))))
    return sorted(chosen)


def crash_states(
    ops: Sequence[Op], *, points: int | None = None, seed: int = 0, start: int = 0
) -> Iterator[CrashState]:
    """The distinct crash states at up to ``points`` crash points (none before ``start``),
    every variant at each."""
    seen: set[tuple[str, str]] = set()
    for point in crash_points(ops, points, seed, start):
        marks_key = str(sum(1 for op in ops[:point] if op[0] == "mark"))
        for n, variant in enumerate(VARIANTS):
            state = _state(ops, point, variant, random.Random(seed * 1_000_003 + point * 31 + n))
            key = (state.digest(), marks_key)
            if key in seen:
                continue
            seen.add(key)
            yield state
