"""A follower's fetch (Kafka's replica ``Fetch``): what it asks its leader and what it gets back,
and their encoding for the node-to-node link (CBOR-ready values: frames travel as byte strings).

Responsibilities:
- ``FetchRequest``: where the follower's log ends (``fetch_offset``), what of it is durable
  (``durable_end``: what the leader's high watermark may count), the epoch of its last record
  (``last_epoch``: how the leader sees whether the two logs diverged, KIP-320), the epoch it
  follows (fencing: a leader answers only its own epoch's followers), its replica identity;
- ``FetchResponse``: the leader's epoch and high watermark, its log start, the frames (all of
  one leader epoch, ``frames_epoch``, as they lie in the leader's log) or where the follower
  must first cut its log back to (``diverging``), or an error code; and the consumers'
  offsets the leader keeps, when the follower's copy is not of their latest version;
- ``divergence``: the leader's side of the check (``OffsetsForLeaderEpoch`` folded into the
  fetch, as KIP-320 does), over the leader's epoch history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

NO_EPOCH: Final = -1  # as ``backends.streams.NO_EPOCH``: a log that never had an epoch

# Error codes of a fetch response (Kafka's names, lower case).
NOT_LEADER: Final = "not_leader_or_follower"  # this node does not lead the partition
FENCED_EPOCH: Final = "fenced_leader_epoch"  # the follower's epoch is older than the leader's
UNKNOWN_EPOCH: Final = "unknown_leader_epoch"  # the follower's epoch is newer (leader behind)
OUT_OF_RANGE: Final = "offset_out_of_range"  # below the leader's log start
UNKNOWN_PARTITION: Final = "unknown_topic_or_partition"


@attrs.frozen
class FetchRequest:
    partition: str  # the partition's cluster key (``vhost/queue``)
    follower: str  # node id
    replica_id: str  # the follower replica's identity (new when its log was created)
    epoch: int  # the leader epoch the follower follows
    fetch_offset: int  # the follower's log end
    durable_end: int  # what of its log the follower has made durable (<= fetch_offset)
    last_epoch: int  # the epoch of the follower's last record (its history's latest)
    max_bytes: int = 1 << 20
    max_wait: float = 0.5  # seconds the leader may wait for records to send
    offsets_version: int = -1  # the version of the leader's offsets the follower has
    log_start: int = 0  # the follower's log start (at ``fetch_offset``: it holds no record)

    def encode(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def decode(cls, body: Any) -> FetchRequest:
        return cls(**_fields(cls, body))


@attrs.frozen
class FetchResponse:
    epoch: int
    high_watermark: int
    log_start: int
    frames_epoch: int = NO_EPOCH  # the leader epoch the frames were written in
    frames: Sequence[tuple[bytes, bytes]] = ()
    diverging: tuple[int, int] | None = None  # (epoch, end offset): cut back first
    error: str | None = None
    # The consumers' offsets the leader keeps (tracked ones, groups' committed ones) and their
    # version, when the follower's version differs (else None).
    offsets: tuple[Mapping[str, int], Mapping[str, int]] | None = None
    offsets_version: int = -1

    def encode(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "high_watermark": self.high_watermark,
            "log_start": self.log_start,
            "frames_epoch": self.frames_epoch,
            "frames": [[head, rest] for head, rest in self.frames],
            "diverging": list(self.diverging) if self.diverging is not None else None,
            "error": self.error,
            "offsets": None if self.offsets is None else [dict(m) for m in self.offsets],
            "offsets_version": self.offsets_version,
        }

    @classmethod
    def decode(cls, body: Any) -> FetchResponse:
        fields = _fields(cls, body)
        fields["frames"] = [(bytes(h), bytes(r)) for h, r in fields.get("frames") or ()]
        diverging = fields.get("diverging")
        fields["diverging"] = (int(diverging[0]), int(diverging[1])) if diverging else None
        offsets = fields.get("offsets")
        fields["offsets"] = (
            None
            if offsets is None
            else tuple({str(k): int(v) for k, v in table.items()} for table in offsets[:2])
        )
        return cls(**fields)


def _fields(cls: type, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValueError(f"{cls.__name__}: not a map")
    names = {field.name for field in attrs.fields(cls)}
    return {key: value for key, value in body.items() if key in names}


def epoch_at(history: Sequence[tuple[int, int]], offset: int) -> tuple[int, int | None]:
    """The leader epoch ``offset`` was written in (``NO_EPOCH`` before the first) and where the
    next epoch starts (None: the epoch is the latest)."""
    epoch, following = NO_EPOCH, None
    for entry_epoch, start in history:
        if start > offset:
            following = start
            break
        epoch = entry_epoch
    return epoch, following


def divergence(
    history: Sequence[tuple[int, int]],
    log_end: int,
    last_epoch: int,
    fetch_offset: int,
    follower_start: int = 0,
) -> tuple[int, int] | None:
    """Where a follower whose log ends at ``fetch_offset`` in ``last_epoch`` diverges from a
    leader with this epoch history and log end: None if its log is a prefix of the leader's,
    else ``(epoch, end_offset)``: the leader's largest epoch not above ``last_epoch`` and the
    offset that epoch ends at on the leader (Kafka's ``OffsetsForLeaderEpoch``). The follower
    cuts its log back to the lesser of that and its own end of that epoch. A follower whose
    log holds no record (it ends at its start, ``follower_start``) cannot diverge."""
    if fetch_offset <= follower_start:
        return None
    epoch, end = NO_EPOCH, log_end
    for entry_epoch, start in history:
        if entry_epoch > last_epoch:
            end = start
            break
        epoch = entry_epoch
    else:
        end = log_end
    if epoch == last_epoch and fetch_offset <= end:
        return None
    return epoch, min(end, fetch_offset)
