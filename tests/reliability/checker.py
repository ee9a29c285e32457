"""What the kill -9 checker's clients saw (``History``) and Jepsen's counters over it.

Classic queue (``check_queue``), with P = the publish attempts of a message id (a publish whose
outcome a crash hid is sent again, same id, after the reconnect):
- lost: confirmed, never consumed by the end (the end drains everything);
- unexpected: consumed, never published;
- recovered: never confirmed (outcome unknown, or nacked), yet consumed;
- duplicated: consumed more than once. Allowed only as follows: a delivery's ack is *durable*
  once a publish sent after it on the same connection was confirmed (a flush that began after
  the ack covered it; acks are otherwise durable lazily); each copy of a message comes unflagged
  (``redelivered=false``) at most once and never again after a durable ack. So: at most P
  unflagged deliveries, at most P durable acks, and no delivery after the P-th durable ack.
  Anything else is a violation (an acked message resurrected, or a repeat not flagged).

Order: a consumer gets a sender's fresh messages (unflagged, sent once) in the order they were
sent, within a round; the stream holds a sender's messages (sent once) in the order sent.

Stream (``check_stream``), read by offset: the final image (every offset read from 0 after the
last restart) must hold offsets 0..N-1 without a gap; lost/unexpected/recovered as above;
duplicated: an id at more than one offset, allowed up to P offsets. Every reader, resuming at
last-seen + 1 across restarts, must have seen exactly offsets 0, 1, 2, ... in order (nothing
skipped, nothing twice), each holding the id the final image has there.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass
class Delivery:
    seq: int  # global order of receipt
    round: int
    consumer: str
    msg_id: str
    redelivered: bool
    acked: bool = False  # basic.ack sent
    durable_ack: bool = False  # and a publish sent after it on that connection was confirmed


@dataclass
class History:
    """Everything the clients of a run recorded; one lock for all of it (clients are threads)."""

    attempts: Counter[str] = field(default_factory=Counter)
    confirmed: set[str] = field(default_factory=set)
    nacked: set[str] = field(default_factory=set)
    deliveries: list[Delivery] = field(default_factory=list)
    stream_reads: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    final_image: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    confirmed_in: Counter[int] = field(default_factory=Counter)  # round -> confirms
    delivered_in: Counter[int] = field(default_factory=Counter)  # round -> deliveries
    round: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self, msg_id: str) -> None:
        with self.lock:
            self.attempts[msg_id] += 1

    def confirm(self, msg_id: str, ok: bool) -> None:
        with self.lock:
            (self.confirmed if ok else self.nacked).add(msg_id)
            self.confirmed_in[self.round] += ok

    def deliver(self, consumer: str, msg_id: str, redelivered: bool) -> Delivery:
        with self.lock:
            d = Delivery(len(self.deliveries), self.round, consumer, msg_id, redelivered)
            self.deliveries.append(d)
            self.delivered_in[self.round] += 1
            return d

    def stream_read(self, reader: str, offset: int, msg_id: str) -> None:
        with self.lock:
            self.stream_reads.setdefault(reader, []).append((self.round, offset, msg_id))


@dataclass
class Counts:
    published: int = 0  # distinct ids attempted
    confirmed: int = 0
    nacked: int = 0
    retried: int = 0  # ids published more than once
    consumed: int = 0  # deliveries (queue) or offsets (stream image)
    lost: int = 0
    unexpected: int = 0
    duplicated: int = 0
    recovered: int = 0
    violations: list[str] = field(default_factory=list)

    def line(self, what: str) -> str:
        names = "published confirmed nacked retried consumed lost unexpected duplicated recovered"
        counts = " ".join(f"{n}={getattr(self, n)}" for n in names.split())
        return f"{what}: {counts} violations={len(self.violations)}"


def _base(h: History, consumed_ids: set[str]) -> Counts:
    c = Counts(len(h.attempts), len(h.confirmed), len(h.nacked))
    c.retried = sum(1 for n in h.attempts.values() if n > 1)
    lost = sorted(h.confirmed - consumed_ids)
    unexpected = sorted(consumed_ids - set(h.attempts))
    c.lost, c.unexpected = len(lost), len(unexpected)
    c.recovered = len(consumed_ids - h.confirmed - set(unexpected))
    if lost:
        c.violations.append(f"{len(lost)} confirmed never consumed, e.g. {lost[:5]}")
    if unexpected:
        c.violations.append(f"{len(unexpected)} consumed, never published: {unexpected[:5]}")
    return c


def check_queue(h: History) -> Counts:
    by_id: dict[str, list[Delivery]] = defaultdict(list)
    for d in sorted(h.deliveries, key=lambda d: d.seq):
        by_id[d.msg_id].append(d)
    c = _base(h, set(by_id))
    c.consumed = len(h.deliveries)
    for msg_id, ds in by_id.items():
        if len(ds) < 2:
            continue
        c.duplicated += 1
        copies = max(h.attempts[msg_id], 1)
        unflagged = sum(not d.redelivered for d in ds)
        durable = [i for i, d in enumerate(ds) if d.durable_ack]
        trace = [(d.round, d.consumer, d.redelivered, d.acked, d.durable_ack) for d in ds]
        if unflagged > copies:
            c.violations.append(f"{msg_id}: {unflagged} unflagged deliveries of {copies}: {trace}")
        if len(durable) > copies or (len(durable) == copies and durable[-1] < len(ds) - 1):
            c.violations.append(f"{msg_id}: delivered after a durable ack: {trace}")
    # Order: each consumer gets a sender's fresh (unflagged, never retried) messages in the
    # order they were sent, within a round.
    last: dict[tuple[int, str, str], int] = {}
    for d in h.deliveries:
        if d.redelivered or h.attempts[d.msg_id] != 1:
            continue
        sender, seq = sender_seq(d.msg_id)
        key = (d.round, d.consumer, sender)
        if seq <= last.get(key, -1):
            c.violations.append(f"{d.consumer} got {d.msg_id} after {sender}-{last[key]}")
        last[key] = seq
    return c


def sender_seq(msg_id: str) -> tuple[str, int]:
    """``("p0", 12)`` for a publisher's ``p0-12``, ``("c1", 3)`` for a barrier's ``c1-b3``."""
    sender, _, seq = msg_id.rpartition("-")
    return sender, int(seq.lstrip("b"))


def check_stream(h: History) -> Counts:
    image = h.final_image
    c = _base(h, {m for ids in image.values() for m in ids})
    c.consumed = len(image)
    if sorted(image) != list(range(len(image))):
        gaps = sorted(set(range(max(image, default=-1) + 1)) - set(image))
        c.violations.append(f"the stream has gaps at offsets {gaps[:10]}")
    for offset, ids in image.items():
        if len(ids) != 1:
            c.violations.append(f"offset {offset} read {len(ids)} times in the final image: {ids}")
    at = {offset: ids[0] for offset, ids in image.items()}
    offsets_of: dict[str, list[int]] = defaultdict(list)
    for offset, msg_id in sorted(at.items()):
        offsets_of[msg_id].append(offset)
    for msg_id, offsets in offsets_of.items():
        if len(offsets) > 1:
            c.duplicated += 1
            if len(offsets) > h.attempts[msg_id]:
                times = h.attempts[msg_id]
                c.violations.append(f"{msg_id} at offsets {offsets}, published {times}x")
    last: dict[str, tuple[int, int]] = {}  # sender -> (seq, offset): the stream keeps order
    for offset, msg_id in sorted(at.items()):
        if h.attempts[msg_id] == 1:
            sender, seq = sender_seq(msg_id)
            if seq <= last.get(sender, (-1, -1))[0]:
                c.violations.append(f"{msg_id} at {offset}, after {sender}-{last[sender]}")
            last[sender] = (seq, offset)
    for reader, reads in h.stream_reads.items():
        expected = 0
        for rnd, offset, msg_id in reads:
            if offset != expected:
                what = "skipped to" if offset > expected else "went back to"
                c.violations.append(f"{reader} {what} {offset} expecting {expected} (round {rnd})")
                break
            if at.get(offset) != msg_id:
                c.violations.append(
                    f"{reader} read {msg_id} at offset {offset} in round {rnd}; "
                    f"the stream holds {at.get(offset)} there"
                )
            expected += 1
        if expected != len(at) and not any(v.startswith(reader) for v in c.violations):
            c.violations.append(f"{reader} stopped at {expected} of {len(at)} offsets")
    return c
