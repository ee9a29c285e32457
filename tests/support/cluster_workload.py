"""Clients of an in-process cluster (``cluster_sim``) that write a history for the checker
(``cluster_history``): producers publishing through any live node, consumers reading from any
live node, and the replicas' final logs taken at the end."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable

import trio

from tests.support.cluster_history import CONFIRMED, NACKED, History, Publish, Replica, payload_of
from tests.support.cluster_sim import Cluster
from tqbroker.model import Message

PARTITION = "%2F/s"
SEED_VARIABLE = "TQBROKER_CLUSTER_SEED"


def seeds(default: int) -> list[int]:
    """The seed of a seeded run: ``TQBROKER_CLUSTER_SEED`` when set (a replay), else
    ``default``."""
    if SEED_VARIABLE in os.environ:
        return [int(os.environ[SEED_VARIABLE])]
    return [default]


async def produce(made: Cluster, history: History, name: str, rng: random.Random) -> None:
    """Publish one message at a time through a random live node until cancelled, recording
    each outcome; a nacked one is sent again under the same sequence number. Cancelled while a
    confirm is pending, the publish stays unknown."""
    seq, last_seq = 0, -1
    while True:
        live = sorted(made.members)
        if not live:
            await trio.sleep(0.05)
            continue
        member = made.members[rng.choice(live)]
        # A nack says "not confirmed", not "not written" (a forward cut off after the leader
        # took it): a publish sent again may be duplicated, as docs/cluster.md says.
        publish = Publish(name, seq, PARTITION, resent=seq == last_seq)
        last_seq = seq
        history.publishes.append(publish)
        try:
            _first, taken, error = member.partition().append(
                [Message("", "s", b"", payload_of(name, seq))]
            )
        except (KeyError, AssertionError):  # the stream is not open there (a node restarting)
            taken, error = [], None
        if error is not None or not taken:
            publish.outcome = NACKED
            await trio.sleep(0.05)
            continue
        durability = taken[0]
        if durability is None:
            publish.outcome = CONFIRMED
        else:
            commit, ticket = durability
            with trio.move_on_after(15):
                publish.outcome = CONFIRMED if await commit.wait(ticket) else NACKED
        if publish.outcome == CONFIRMED:
            seq += 1
        else:
            await trio.sleep(0.05)


async def consume(made: Cluster, history: History, name: str, rng: random.Random) -> None:
    """Read on from the last offset delivered, each time from a random live node (below its
    high watermark, as any reader), recording every delivery, until cancelled."""
    offset = 0
    while True:
        await trio.sleep(rng.uniform(0.02, 0.2))
        live = sorted(made.members)
        if not live:
            continue
        try:
            records = made.members[rng.choice(live)].partition().read_many(offset, 50)
        except (KeyError, AssertionError, OSError):  # not open there, or a damaged log
            continue
        for record in records:
            history.deliveries.append((name, PARTITION, record.offset, record.message.body))
            offset = record.offset + 1


def take_replicas(made: Cluster, history: History, nodes: Iterable[str] | None = None) -> None:
    """Every (or each named) live node's log of the stream, into the history."""
    for name in sorted(made.members if nodes is None else nodes):
        partition = made.members[name].partition()
        high_watermark = partition.high_watermark
        records = partition.read_many(0, high_watermark + 1)
        frames, _end = partition.replica_frames(0, high_watermark, 1 << 30)
        history.replicas.append(
            Replica(
                node=name,
                partition=PARTITION,
                records={r.offset: r.message.body for r in records},
                frames=[head + rest for head, rest in frames],
                high_watermark=high_watermark,
            )
        )


def in_sync(made: Cluster, nodes: int = 3) -> bool:
    """A leader with ``nodes`` in its ISR and its high watermark at its log's end (no publish
    pending: a leader elected after a restart starts from its log start until its followers
    fetch), every live replica at that high watermark."""
    leader = made.leader()
    return (
        leader is not None
        and len(leader.isr) == nodes
        and leader.high_watermark == leader.partition.log_end_offset
        and {m.partition().high_watermark for m in made.members.values()} == {leader.high_watermark}
    )
