"""Recovery of the RocksDB backend at ``open`` and ``open_queue``.

Responsibilities:
- ``start_run``: check the database format, start a new run (raise the epoch with a synced write,
  drop every transient record and the clean-shutdown mark; on a database opened read-only, the
  first write of the run) and load the queue registry;
- ``scan_queue``: rebuild a recovered queue's index from its records and its reservation.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from rocksdict import Rdict, WriteBatch, WriteOptions

from .codec import (
    EPOCH_SHIFT,
    FORMAT_VERSION,
    MAX_EPOCH,
    META_CLEAN,
    META_EPOCH,
    META_FORMAT,
    META_NEXT_QUEUE_ID,
    REGISTRY,
    TRANSIENT,
    TRANSIENT_END,
    body_size,
    message_id_of,
    messages_start,
    pack_u64,
    parse_registry_key,
    queue_prefix,
    reservation_key,
    unpack_u32,
    unpack_u64,
)
from .writer import Writer

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What ``start_run`` found and started."""

    recovered_cleanly: bool | None
    """``None`` for a new database, else whether the previous run closed it cleanly."""
    id_base: int
    """This run's first message id (see ``codec.META_EPOCH``)."""
    id_limit: int
    """The first id past this run's."""
    next_qid: int
    registry: dict[tuple[str, str], int] = field(default_factory=dict)
    """Queue ids by (vhost, queue)."""


@dataclass
class RecoveredQueue:
    """A queue's index, rebuilt from its records."""

    next_id: int
    reserved: int
    flagged: array[int]
    fresh: array[int]
    ready_bytes: int

    @classmethod
    def empty(cls, id_base: int) -> RecoveredQueue:
        """A new queue's: its ids start at this run's first."""
        return cls(next_id=id_base, reserved=0, flagged=array("Q"), fresh=array("Q"), ready_bytes=0)


def start_run(writer: Writer, db: Rdict, path: Path) -> Run:
    """At ``open``: check the format, start a new run (epoch), load the queue registry. When
    the database could only be opened read-only (a full disk), the writes that start the run
    are the first batch the writer writes: every id of this run that reaches the disk does so
    with or after the new epoch, so none is ever handed out twice either."""
    recovered_cleanly: bool | None = None
    stored_format = db.get(META_FORMAT)
    ops: dict[bytes, bytes | None] = {}
    ranges: list[tuple[bytes, bytes]] = []
    if stored_format is None:
        if next(iter(db.keys()), None) is not None:
            raise RuntimeError(f"{path} holds a database that is not tqbroker's")
        ops[META_FORMAT] = FORMAT_VERSION
        epoch = 0
    elif stored_format != FORMAT_VERSION:
        raise RuntimeError(f"{path}: unsupported format {stored_format!r}")
    else:
        recovered_cleanly = db.get(META_CLEAN) is not None
        ops[META_CLEAN] = None
        # Transient messages never survive a restart, clean or not.
        ranges.append((TRANSIENT, TRANSIENT_END))
        stored_epoch = db.get(META_EPOCH)
        epoch = unpack_u64(stored_epoch) + 1 if stored_epoch is not None else 1
        if epoch > MAX_EPOCH:
            raise RuntimeError(f"{path}: out of run epochs")
    # Durable before any id of this run is handed out, so none is ever handed out twice.
    ops[META_EPOCH] = pack_u64(epoch)
    if writer.read_only:
        writer.defer(ops, ranges)
    else:
        start = WriteBatch(raw_mode=True)
        for meta, stored in ops.items():
            if stored is None:
                start.delete(meta)
            else:
                start.put(meta, stored)
        for begin, end in ranges:
            start.delete_range(begin, end)
        options = WriteOptions()
        options.sync = writer.sync
        db.write(start, options)
    next_qid = db.get(META_NEXT_QUEUE_ID)
    run = Run(
        recovered_cleanly=recovered_cleanly,
        id_base=max(1, epoch << EPOCH_SHIFT),
        id_limit=(epoch + 1) << EPOCH_SHIFT,
        next_qid=unpack_u32(next_qid) if next_qid is not None else 1,
    )
    for key, value in db.items(from_key=REGISTRY):
        if not isinstance(key, bytes) or not key.startswith(REGISTRY):
            break
        qid = unpack_u32(value)
        run.registry[parse_registry_key(key)] = qid
        run.next_qid = max(run.next_qid, qid + 1)
    return run


def scan_queue(writer: Writer, qid: int, id_base: int) -> RecoveredQueue:
    """Rebuild queue ``qid``'s index: every message below its reservation may have been
    delivered (flagged), none at or above it was (fresh)."""
    prefix = queue_prefix(qid)
    reserved = writer.read_u64(reservation_key(prefix)) or 0
    queue = RecoveredQueue(
        next_id=max(id_base, reserved),
        reserved=reserved,
        flagged=array("Q"),
        fresh=array("Q"),
        ready_bytes=0,
    )
    start = messages_start(prefix)
    with writer.reading() as db:
        for key, record in db.items(from_key=start):
            if not isinstance(key, bytes) or not key.startswith(start):
                break
            message_id = message_id_of(key)
            (queue.flagged if message_id < reserved else queue.fresh).append(message_id)
            queue.next_id = max(queue.next_id, message_id + 1)
            queue.ready_bytes += body_size(record)
    return queue
