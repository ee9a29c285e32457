"""Offsets: resolving the offset options against the broker, rate limits, the checks for lost
data and cutting offset ranges into Spark input partitions. Plain Python (no Spark), so it is
tested without a SparkSession.

Responsibilities:
- ``to_json`` / ``from_json``: streaming offsets as Spark stores them in its checkpoint,
  ``{"topic": {"0": 42, "1": 17}}`` (string keys, a deterministic order: Spark compares
  offsets in their serialized form);
- ``subscribed``: the partitions a query reads, with their earliest and latest offsets;
- ``resolve``: ``startingOffsets`` and friends as concrete offsets per partition;
- ``rate_limit``: ``maxOffsetsPerTrigger`` split across partitions in proportion to their
  backlog (exactly ``max_rows`` in all, at least one offset for each partition with a backlog);
- ``ranges``: the ``[start, end)`` ranges to read, with ``failOnDataLoss`` applied where
  retention (or a deleted topic) removed offsets; ``split``: ranges cut for parallelism
  (``minPartitions``, ``maxRecordsPerPartition``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ._client import Client, PartitionInfo
from ._options import EARLIEST, LATEST, OffsetSpec, OptionError, SourceOptions

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


class DataLossError(RuntimeError):
    """Offsets a query was to read are gone (``failOnDataLoss=true``)."""


class Range(NamedTuple):
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = offsets[topic, partition]
    return result


def from_json(raw: Mapping[str, Any]) -> Offsets:
    """Offsets back from Spark (``ValueError`` for what this source never wrote)."""
    offsets: Offsets = {}
    for topic, partitions in raw.items():
        if not isinstance(partitions, dict):
            raise ValueError(f"not a tqbroker offset: {raw!r}")
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or isinstance(offset, bool):
                raise ValueError(f"not a tqbroker offset: {raw!r}")
            offsets[topic, int(partition)] = int(offset)
    return offsets


def subscribed(client: Client, options: SourceOptions) -> dict[TopicPartition, PartitionInfo]:
    """The partitions to read, in order, with their offsets now."""
    found: dict[TopicPartition, PartitionInfo] = {}
    for topic in options.topics:
        infos = {info.partition: info for info in client.partitions(topic)}
        wanted: Iterable[int] = infos
        if options.assign is not None:
            wanted = options.assign[topic]
            missing = sorted(set(wanted) - set(infos))
            if missing:
                raise OptionError(
                    f"option 'assign': topic '{topic}' has partitions 0..{len(infos) - 1}, "
                    f"not {', '.join(map(str, missing))}"
                )
        for partition in wanted:
            found[topic, partition] = infos[partition]
    return found


def resolve(
    spec: OffsetSpec,
    infos: Mapping[TopicPartition, PartitionInfo],
    client: Client,
    *,
    ending: bool = False,
    strategy: str = "error",
) -> Offsets:
    """``spec`` as an offset per partition in ``infos``. A timestamp with no record at or after
    it resolves to the latest offset for an ending spec, and per ``strategy`` for a starting
    one (``error``: raise; ``latest``)."""
    if spec.kind == "earliest":
        return {tp: info.earliest for tp, info in infos.items()}
    if spec.kind == "latest":
        return {tp: info.latest for tp, info in infos.items()}
    if spec.kind in ("offsets", "timestamps"):
        assert spec.per_partition is not None
        given = {(t, p): v for t, per in spec.per_partition.items() for p, v in per.items()}
        if set(given) != set(infos):
            missing = ", ".join(f"{t}/{p}" for t, p in sorted(set(infos) - set(given)))
            extra = ", ".join(f"{t}/{p}" for t, p in sorted(set(given) - set(infos)))
            raise OptionError(
                f"option '{spec.option}' must give every partition the query reads, and no "
                "other (use -2 for earliest, -1 for latest)"
                + (f"; missing: {missing}" if missing else "")
                + (f"; not read: {extra}" if extra else "")
            )
        if spec.kind == "offsets":
            resolved: Offsets = {}
            for tp, info in infos.items():
                offset = given[tp]
                if offset == EARLIEST:
                    offset = info.earliest
                elif offset == LATEST:
                    offset = info.latest
                elif offset > info.latest:
                    raise OptionError(
                        f"option '{spec.option}': offset {offset} of {tp[0]}/{tp[1]} is past the "
                        f"partition's end ({info.latest})"
                    )
                resolved[tp] = offset
            return resolved
        wanted = given
    else:
        assert spec.timestamp is not None
        wanted = {tp: spec.timestamp for tp in infos}
    found: dict[tuple[str, int], dict[int, int | None]] = {}
    resolved = {}
    for tp, info in infos.items():
        key = (tp[0], wanted[tp])
        if key not in found:
            found[key] = client.offsets_for_timestamp(*key)
        first = found[key].get(tp[1])
        if first is None:
            if not ending and strategy == "error":
                raise OptionError(
                    f"option '{spec.option}': no record of {tp[0]}/{tp[1]} has a timestamp at "
                    f"or after {wanted[tp]} (set startingOffsetsByTimestampStrategy=latest to "
                    "start at the end instead)"
                )
            first = info.latest
        resolved[tp] = first
    return resolved


def rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """Where a micro-batch from ``start`` ends when it may read ``max_rows`` offsets of the
    backlog up to ``latest``: shares in proportion to each partition's backlog, at least one
    for each partition that has one (as far as ``max_rows`` goes), largest remainders first."""
    backlog = {tp: latest[tp] - start[tp] for tp in sorted(latest) if latest[tp] > start[tp]}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    given = dict.fromkeys(backlog, 0)
    budget = max_rows
    if budget >= len(backlog):  # nobody starves
        given = dict.fromkeys(backlog, 1)
        budget -= len(backlog)
    rest_total = total - sum(given.values())
    remainders = []
    for tp, size in backlog.items():
        share, remainder = divmod(budget * (size - given[tp]), rest_total)
        given[tp] += share
        remainders.append((-remainder, tp))
    left = max_rows - sum(given.values())
    for _remainder, tp in sorted(remainders)[:left]:
        given[tp] += 1
    end = dict(latest)
    for tp, amount in given.items():
        end[tp] = start[tp] + min(amount, backlog[tp])
    return end


def ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    infos: Mapping[TopicPartition, PartitionInfo],
    *,
    fail_on_data_loss: bool,
) -> list[Range]:
    """The non-empty ranges between ``start`` and ``end`` (a partition missing from ``start``
    starts at its earliest offset), checked against what the partitions hold now."""
    found = []
    for tp in sorted(end):
        info = infos.get(tp)
        if info is None:
            report_data_loss(
                f"partition {tp[0]}/{tp[1]} is gone (was the topic deleted?)", fail_on_data_loss
            )
            continue
        begin, stop = start.get(tp, info.earliest), end[tp]
        if begin < info.earliest and begin < stop:
            report_data_loss(
                f"offsets {begin} to {min(stop, info.earliest) - 1} of {tp[0]}/{tp[1]} are gone "
                f"(retention removed them: the partition starts at {info.earliest} now)",
                fail_on_data_loss,
            )
            begin = info.earliest
        if stop > info.latest:
            report_data_loss(
                f"{tp[0]}/{tp[1]} ends at {info.latest}, before offset {stop} that was seen "
                "(was the topic deleted and declared again?)",
                fail_on_data_loss,
            )
            stop = info.latest
        if begin < stop:
            found.append(Range(tp[0], tp[1], begin, stop))
    return found


def split(
    found: Sequence[Range], *, min_partitions: int | None, max_records: int | None
) -> list[Range]:
    """Cut ranges so none holds more than ``max_records`` offsets, then (as Kafka's
    ``minPartitions``) into about ``min_partitions`` pieces in proportion to their sizes."""
    result = list(found)
    if max_records is not None:
        result = [piece for r in result for piece in _cut(r, -(-r.size // max_records))]
    if min_partitions is not None and len(result) < min_partitions:
        total = sum(r.size for r in result)
        result = [
            piece
            for r in result
            for piece in _cut(r, max(round(r.size / total * min_partitions), 1))
        ]
    return result


def _cut(whole: Range, parts: int) -> list[Range]:
    pieces = []
    remaining, begin = whole.size, whole.start
    for part in range(parts):
        size = remaining // (parts - part)
        remaining -= size
        if size:
            pieces.append(whole._replace(start=begin, end=begin + size))
        begin += size
    return pieces


def report_data_loss(message: str, fail: bool) -> None:
    if fail:
        raise DataLossError(
            f"Some data may have been lost: {message}. If you don't want the query to fail in "
            "such cases, set the source option failOnDataLoss to false."
        )
    log.warning("tqbroker source: %s; skipping them (failOnDataLoss=false)", message)
