"""A stream's leader epoch history (Kafka's ``LeaderEpochFileCache``) and its checkpoint.

Responsibilities:
- the ``(epoch, start_offset)`` entries, oldest first, both strictly increasing: the first
  offset of each leader epoch (``begin``), trimmed when the log is truncated (``truncate``);
- ``end_offset_for``: Kafka's ``OffsetsForLeaderEpoch``, where a follower's log diverged;
- the checkpoint, ``leader-epoch.cbor`` in the stream's directory (a CBOR array of
  ``[epoch, start_offset]`` pairs), written atomically and fsync'd whenever the history
  changes, before any record of a new epoch can reach the disk (``save``); a missing or
  unreadable file is an empty history (a stream from before epochs existed).

The frames themselves carry no epoch (the record format is unchanged): the checkpoint is the
only record of the history, which is why it is made durable before an epoch takes records.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from pathlib import Path

import cbor2

from ...storage_env import StorageEnv
from ..streams import NO_EPOCH, StaleEpoch

log = logging.getLogger(__name__)

EPOCH_FILE = "leader-epoch.cbor"


class EpochHistory:
    def __init__(self, entries: list[tuple[int, int]] | None = None) -> None:
        self.entries: list[tuple[int, int]] = entries or []

    @property
    def latest(self) -> int:
        return self.entries[-1][0] if self.entries else NO_EPOCH

    def begun(self, epoch: int, start_offset: int) -> list[tuple[int, int]] | None:
        """The history with ``epoch`` begun at ``start_offset`` (None: nothing changes, the
        epoch is the latest already). An entry of an earlier epoch at ``start_offset`` (it
        took no record) is replaced. ``StaleEpoch`` below the latest epoch."""
        latest = self.latest
        if epoch == latest:
            return None
        if epoch < latest:
            raise StaleEpoch(f"leader epoch {epoch} is below the log's epoch {latest}")
        kept = [entry for entry in self.entries if entry[1] < start_offset]
        return [*kept, (epoch, start_offset)]

    def truncated(self, end: int) -> list[tuple[int, int]]:
        """The history of a log cut back to ``end``: the epochs that start at or past it go
        (Kafka's ``truncateFromEnd``)."""
        return [entry for entry in self.entries if entry[1] < end]

    def end_offset_for(self, epoch: int, log_end: int) -> int:
        """The start offset of the first epoch above ``epoch``, or ``log_end``."""
        i = bisect_right([e for e, _start in self.entries], epoch)
        return self.entries[i][1] if i < len(self.entries) else log_end

    def save(
        self, env: StorageEnv, directory: Path, entries: list[tuple[int, int]], *, fsync: bool
    ) -> None:
        """Write ``entries`` as the checkpoint, then adopt them (OSError: nothing changed)."""
        if entries != self.entries:
            data = cbor2.dumps([list(entry) for entry in entries])
            env.atomic_write(directory / EPOCH_FILE, data, fsync=fsync)
            self.entries = entries

    @classmethod
    def load(cls, directory: Path) -> EpochHistory:
        try:
            raw = cbor2.loads((directory / EPOCH_FILE).read_bytes())
        except FileNotFoundError:
            return cls()  # a stream from before epochs, or one that never had one
        except (ValueError, cbor2.CBORDecodeError) as exc:  # (OSError: the open fails)
            log.error("%s: unreadable %s (%s): no epoch history", directory, EPOCH_FILE, exc)
            return cls()
        entries: list[tuple[int, int]] = []
        if isinstance(raw, list):
            for item in raw:
                if isinstance(item, list) and len(item) == 2:
                    entries.append((int(item[0]), int(item[1])))
        return cls(entries)
