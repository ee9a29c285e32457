"""A Jepsen-style checker over one history of a cluster run: what the clients did and saw,
and what every replica holds at the end (the invariants of ``shared/reference/cluster.md`` §C).

A history records:
- publishes: (producer, sequence number, partition), in the order each producer sent them, and
  how each ended: confirmed, nacked, or unknown (the connection died first);
- deliveries: (consumer, partition, offset, payload), as consumers received them;
- high watermarks observed by clients (partition, value), in the order each client saw them;
- accepted appends: (node, partition, epoch): which node took an append in which leader epoch;
- at the end, every replica's log of every partition: its records (offset -> payload), its
  frames' bytes below its high watermark, and that high watermark.

``check`` returns the violations found (an empty list: the history passes):
1. **no lost confirms**: every confirmed publish is in the final log of every replica whose high
   watermark is past it, and at least in one replica's log below its high watermark;
2. **no phantom or aborted reads**: every delivered record is in the final logs, at the same
   offset, with the same payload;
3. **unique offsets**: an offset holds one payload, across deliveries and final logs;
4. **per-producer order**: a producer's confirmed publishes to a partition lie in send order;
5. **no duplicates** of a publish that was confirmed the first time (a duplicate is allowed
   only for one that was resent after an unknown outcome);
6. **prefix agreement**: replicas hold byte-identical frames up to the least high watermark;
7. **monotonic views**: the high watermarks a client observes never go back;
8. **one writer per epoch**: no two nodes took appends for a partition in the same epoch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import attrs

CONFIRMED = "confirmed"
NACKED = "nacked"
UNKNOWN = "unknown"


@attrs.define
class Publish:
    producer: str
    seq: int
    partition: str
    outcome: str = UNKNOWN
    resent: bool = False  # sent again after an unknown outcome

    @property
    def payload(self) -> bytes:
        return payload_of(self.producer, self.seq)


def payload_of(producer: str, seq: int) -> bytes:
    return f"{producer}:{seq}".encode()


@attrs.define
class Replica:
    """One node's copy of one partition at the end of the run."""

    node: str
    partition: str
    records: dict[int, bytes]  # offset -> payload
    frames: list[bytes]  # the frames below its high watermark, as stored
    high_watermark: int


@attrs.define
class History:
    publishes: list[Publish] = attrs.field(factory=list)
    deliveries: list[tuple[str, str, int, bytes]] = attrs.field(factory=list)
    watermarks: list[tuple[str, str, int]] = attrs.field(factory=list)  # (client, partition, hw)
    appends: list[tuple[str, str, int]] = attrs.field(factory=list)  # (node, partition, epoch)
    replicas: list[Replica] = attrs.field(factory=list)


def check(history: History) -> list[str]:
    violations: list[str] = []
    by_partition: dict[str, list[Replica]] = defaultdict(list)
    for replica in history.replicas:
        by_partition[replica.partition].append(replica)
    violations += _lost_confirms(history.publishes, by_partition)
    violations += _reads(history.deliveries, by_partition)
    violations += _unique_offsets(history.deliveries, by_partition)
    violations += _order_and_duplicates(history.publishes, by_partition)
    violations += _prefix_agreement(by_partition)
    violations += _monotonic(history.watermarks)
    violations += _one_writer(history.appends)
    return violations


def _committed(replica: Replica) -> dict[bytes, list[int]]:
    """Payload -> offsets below the replica's high watermark."""
    found: dict[bytes, list[int]] = defaultdict(list)
    for offset, payload in replica.records.items():
        if offset < replica.high_watermark:
            found[payload].append(offset)
    return found


def _lost_confirms(
    publishes: Iterable[Publish], by_partition: dict[str, list[Replica]]
) -> list[str]:
    violations = []
    committed = {id(r): _committed(r) for rs in by_partition.values() for r in rs}
    for publish in publishes:
        if publish.outcome != CONFIRMED:
            continue
        replicas = by_partition.get(publish.partition, [])
        holders = [r for r in replicas if publish.payload in committed[id(r)]]
        if not holders:
            violations.append(
                f"lost confirm: {publish.producer}#{publish.seq} on {publish.partition} is "
                "below no replica's high watermark"
            )
            continue
        offset = min(committed[id(holders[0])][publish.payload])
        for replica in replicas:
            if offset < replica.high_watermark and replica.records.get(offset) != publish.payload:
                violations.append(
                    f"lost confirm: {publish.producer}#{publish.seq} missing at offset {offset} "
                    f"on {replica.node} (high watermark {replica.high_watermark})"
                )
    return violations


def _reads(
    deliveries: Iterable[tuple[str, str, int, bytes]], by_partition: dict[str, list[Replica]]
) -> list[str]:
    violations = []
    for consumer, partition, offset, payload in deliveries:
        for replica in by_partition.get(partition, []):
            if offset < replica.high_watermark and replica.records.get(offset) != payload:
                violations.append(
                    f"phantom read: {consumer} got {payload!r} at {partition}@{offset}; "
                    f"{replica.node} holds {replica.records.get(offset)!r}"
                )
    return violations


def _unique_offsets(
    deliveries: Iterable[tuple[str, str, int, bytes]], by_partition: dict[str, list[Replica]]
) -> list[str]:
    seen: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    for _consumer, partition, offset, payload in deliveries:
        seen[(partition, offset)].add(payload)
    for partition, replicas in by_partition.items():
        for replica in replicas:
            for offset, payload in replica.records.items():
                if offset < replica.high_watermark:
                    seen[(partition, offset)].add(payload)
    return [
        f"offset {partition}@{offset} holds {len(payloads)} payloads: {sorted(payloads)!r}"
        for (partition, offset), payloads in sorted(seen.items())
        if len(payloads) > 1
    ]


def _order_and_duplicates(
    publishes: Iterable[Publish], by_partition: dict[str, list[Replica]]
) -> list[str]:
    violations = []
    sent: dict[tuple[str, str], list[Publish]] = defaultdict(list)
    for publish in publishes:
        sent[(publish.producer, publish.partition)].append(publish)
    for (producer, partition), ordered in sent.items():
        replicas = by_partition.get(partition, [])
        if not replicas:
            continue
        longest = max(replicas, key=lambda r: r.high_watermark)
        committed = _committed(longest)
        resent = {p.seq for p in ordered if p.resent}  # a sequence sent more than once
        last = -1
        for publish in ordered:
            offsets = committed.get(publish.payload, [])
            if len(offsets) > 1 and publish.seq not in resent:
                violations.append(
                    f"duplicate: {producer}#{publish.seq} at offsets {offsets} of {partition} "
                    "(never resent)"
                )
            if publish.outcome != CONFIRMED or not offsets:
                continue
            if offsets[0] < last:
                violations.append(
                    f"reordered: {producer}#{publish.seq} at {partition}@{offsets[0]}, "
                    f"before an earlier publish at {last}"
                )
            last = max(last, offsets[0])
    return violations


def _prefix_agreement(by_partition: dict[str, list[Replica]]) -> list[str]:
    violations = []
    for partition, replicas in by_partition.items():
        if len(replicas) < 2:
            continue
        least = min(replicas, key=lambda r: r.high_watermark)
        for replica in replicas:
            common = min(len(least.frames), len(replica.frames))
            if replica.frames[:common] != least.frames[:common]:
                first = next(n for n in range(common) if replica.frames[n] != least.frames[n])
                violations.append(
                    f"replicas differ: {partition} frame {first} on {replica.node} and {least.node}"
                )
    return violations


def _monotonic(watermarks: Iterable[tuple[str, str, int]]) -> list[str]:
    violations = []
    last: dict[tuple[str, str], int] = {}
    for client, partition, value in watermarks:
        previous = last.get((client, partition), -1)
        if value < previous:
            violations.append(
                f"high watermark went back: {client} saw {partition} at {previous}, then {value}"
            )
        last[(client, partition)] = max(previous, value)
    return violations


def _one_writer(appends: Iterable[tuple[str, str, int]]) -> list[str]:
    writers: dict[tuple[str, int], set[str]] = defaultdict(set)
    for node, partition, epoch in appends:
        writers[(partition, epoch)].add(node)
    return [
        f"two writers in epoch {epoch} of {partition}: {sorted(nodes)}"
        for (partition, epoch), nodes in sorted(writers.items())
        if len(nodes) > 1
    ]
