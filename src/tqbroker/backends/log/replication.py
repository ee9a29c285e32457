"""The log's side of replication: frames a follower appends verbatim, and cutting a log back.

Responsibilities:
- ``check_frames``: what ``StreamLog.append_frames`` is given (``(head, rest)`` pairs, as
  ``read_frames`` returns them), validated whole before anything is appended: each frame's
  length and CRC-32C, its layout (decoded as a reader would), and offsets that continue the
  log (``OffsetMismatch``) — so a follower never takes a frame its readers would refuse;
- ``cut_position``: where a segment is cut to remove every record at or past an offset (at a
  frame boundary: a frame holding records on both sides goes whole);
- the truncation intent (``truncate.cbor``): written durably before a truncation touches a
  file and removed once it is durable, so that recovery finishes a truncation a power cut
  interrupted (``pending_truncation``): the log is then the old one or the truncated one;
- the replica id (``replica-id``): a replica's UUID, written when its directory is first opened
  (``load_replica_id``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import cbor2

from ...storage_env import StorageEnv
from ..streams import InvalidFrame, OffsetMismatch
from .format import HEAD_SIZE, RECORD_HEAD, RecordError, decode_frame
from .segment import Segment

TRUNCATE_FILE = "truncate.cbor"
REPLICA_FILE = "replica-id"  # the replica's UUID, written when the directory is created


class CheckedFrame(NamedTuple):
    """A frame ready to append: its first and last offsets, greatest timestamp and bytes."""

    offset: int
    last_offset: int
    timestamp_ms: int
    data: bytes


def check_frames(frames: Sequence[tuple[bytes, bytes]], next_offset: int) -> list[CheckedFrame]:
    """The frames, validated, in order; ``InvalidFrame`` or ``OffsetMismatch`` for the first
    that fails (nothing is appended then). The first must start at ``next_offset``; each
    later one above the last offset of the one before (a compacted leader's frames have gaps
    between them, never overlaps)."""
    checked: list[CheckedFrame] = []
    least = next_offset
    for n, (head, rest) in enumerate(frames):
        if len(head) != HEAD_SIZE:
            raise InvalidFrame(f"frame {n}: a head of {len(head)} bytes, not {HEAD_SIZE}")
        length, _crc = RECORD_HEAD.unpack(head)
        if length != 4 + len(rest):
            raise InvalidFrame(f"frame {n}: length {length} for {4 + len(rest)} bytes")
        data = bytes(head) + bytes(rest)
        try:
            frame = decode_frame(data, 0)
        except RecordError as exc:
            raise InvalidFrame(f"frame {n}: {exc}") from None
        if frame is None:  # not with a length that matches the bytes; for the type checker
            raise InvalidFrame(f"frame {n} is cut short")
        if n == 0 and frame.offset != next_offset:
            raise OffsetMismatch(
                f"the first frame starts at offset {frame.offset}, the log at {next_offset}"
            )
        if frame.offset < least:
            raise OffsetMismatch(f"frame {n} starts at offset {frame.offset}, below {least}")
        checked.append(CheckedFrame(frame.offset, frame.last_offset, frame.timestamp_ms, data))
        least = frame.last_offset + 1
    return checked


def cut_position(segment: Segment, offset: int) -> tuple[int, int]:
    """Where to cut ``segment`` (written out: no buffered bytes) so that no record at or past
    ``offset`` is left: the byte position of the first frame whose last offset is at or past
    it (or of a damaged frame met first: what follows it goes too), and the offset the log
    then ends at (``offset``, or the first offset of a frame that straddles it)."""
    pos, _least = segment.position_at_or_before(offset)
    while pos < segment.size:
        try:
            frame = segment.read_at(pos)
        except RecordError:
            return pos, offset
        if frame.last_offset >= offset:
            return pos, min(frame.offset, offset)
        pos += frame.size
    return pos, offset


class Intent(NamedTuple):
    """A truncation under way: cut back to ``offset``, or with ``restart`` emptied and
    continued there (``new_identity``: under a new replica id)."""

    offset: int
    restart: bool = False
    new_identity: bool = False


def write_intent(env: StorageEnv, directory: Path, intent: Intent) -> None:
    """Record, durably, that the log is being cut back as ``intent`` says."""
    env.atomic_write(directory / TRUNCATE_FILE, cbor2.dumps(intent._asdict()))


def clear_intent(env: StorageEnv, directory: Path) -> None:
    """The truncation is durable: forget it (durably: a later start must not redo it after
    appends went past it)."""
    env.fs.unlink(directory / TRUNCATE_FILE, missing_ok=True)
    env.fsync_dir(directory)


def pending_truncation(directory: Path) -> Intent | None:
    """The truncation a crash interrupted, if any (a torn intent file can only be one whose
    truncation never began: it is written durably first)."""
    try:
        intent = cbor2.loads((directory / TRUNCATE_FILE).read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, cbor2.CBORDecodeError):
        return None
    if not isinstance(intent, dict) or not isinstance(intent.get("offset"), int):
        return None
    return Intent(
        int(intent["offset"]), intent.get("restart") is True, intent.get("new_identity") is True
    )


def load_replica_id(env: StorageEnv, directory: Path) -> str:
    """The replica's id, written (atomically) the first time the directory is opened."""
    path = directory / REPLICA_FILE
    try:
        return str(uuid.UUID(path.read_text().strip()))
    except FileNotFoundError:
        pass
    except ValueError:  # a torn write of a new one: nothing relied on it yet
        pass
    return new_replica_id(env, directory)


def new_replica_id(env: StorageEnv, directory: Path) -> str:
    """Give the replica a new id, durably (written atomically)."""
    replica_id = str(uuid.uuid4())
    env.atomic_write(directory / REPLICA_FILE, replica_id.encode())
    return replica_id
