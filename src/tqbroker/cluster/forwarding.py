"""Publishes to a partition another node leads, forwarded to its leader over the node-to-node
link (§4.7 of ``shared/reference/scaleout.md``): any node takes any publish.

Responsibilities:
- ``Forwarder``, on a follower replica: publishes queue up in order and go to the leader in
  batches, one request in flight per partition (so one producer's order holds); each message's
  confirm waits for the leader's answer, which comes once the leader's in-sync replicas have
  it (``ForwardedCommit``, the ``GroupCommit`` the confirms wait on: a ticket is the count of
  messages forwarded so far). A refusal, a lost link or a role change nacks what was not
  answered: the client may send it again (and may then duplicate it: unconfirmed messages
  carry no guarantee). While ``MAX_QUEUED_BYTES`` of bodies wait, new publishes are refused
  (nacked) rather than held without bound;
- offsets stored by consumers on a follower go to the leader too (``store_offset``), which
  keeps every consumer's offsets and sends them to its followers with their fetches;
- ``take_forwarded``: the leader's side, a batch appended through the stream queue and
  answered with how many its ISR confirmed; ``take_offsets``: offsets from a follower;
- the messages' encoding on the link (CBOR-ready lists).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import trio

from ..broker.streams.partition import GroupFence, OffsetKind, Partition
from ..model import Message
from ..plugins.spec import Durability, FlushListener

log = logging.getLogger(__name__)

APPEND: Final = "append"  # the link's operations: forwarded messages
OFFSETS: Final = "offsets"  # and offsets stored on a follower
MAX_BATCH: Final = 4096  # messages in one forwarded request
# Bodies queued for the leader at most: past it, publishes are refused (nacked) until the
# leader catches up, rather than held in memory without bound.
MAX_QUEUED_BYTES: Final = 64 * 1024 * 1024
REFUSED_KEPT: Final = 1024  # refused ranges a late ``wait`` can still tell

Send = Callable[[str, Any], Awaitable[Any]]  # (operation, body) -> the reply's body
PublishRun = Callable[[Sequence[Message]], tuple[list[Durability], Exception | None]]


def encode_messages(messages: Sequence[Message]) -> list[list[Any]]:
    return [[m.exchange, m.routing_key, m.properties_raw, m.body, m.timestamp_ms] for m in messages]


def decode_messages(body: Any) -> list[Message]:
    if not isinstance(body, list):
        raise ValueError("forwarded messages: not a list")
    decoded = []
    for entry in body:
        exchange, routing_key, properties_raw, payload, timestamp_ms = entry
        decoded.append(
            Message(
                str(exchange),
                str(routing_key),
                bytes(properties_raw),
                bytes(payload),
                timestamp_ms=int(timestamp_ms),
            )
        )
    return decoded


async def take_forwarded(publish_run: PublishRun, messages: Sequence[Message]) -> dict[str, Any]:
    """Append forwarded messages here (the leader) and answer once they are confirmed:
    ``taken`` (the first ones, confirmed) and ``error`` (why the rest were not)."""
    durabilities, error = publish_run(messages)
    taken = len(durabilities)
    waits = [d for d in durabilities if d is not None]
    if waits:
        commit, ticket = waits[-1]
        if not await commit.wait(ticket):
            return {"taken": 0, "error": "not confirmed by the in-sync replicas"}
    return {"taken": taken, "error": None if error is None else str(error)}


def take_offsets(
    partition: Partition, body: Any, refuses: Callable[[str, GroupFence], bool]
) -> list[str]:
    """Offsets stored on a follower, kept here (the leader), but for group commits that
    ``refuses`` (a later assignment gave the partition to another member): those groups."""
    for tag, offset in dict(body.get("tracked") or {}).items():
        partition.store_offset(str(tag), int(offset))
    fences = dict(body.get("fences") or {})
    refused = []
    for group, offset in dict(body.get("group") or {}).items():
        fence = fences.get(group)
        if fence is not None and refuses(str(group), GroupFence(str(fence[0]), int(fence[1]))):
            refused.append(str(group))
            continue
        partition.commit_group_offset(str(group), int(offset))
    return refused


class ForwardedCommit:
    """The ``GroupCommit`` of one partition's forwarded publishes (see the module doc)."""

    def __init__(self) -> None:
        self.completed = 0  # messages answered (confirmed or refused)
        self.forwarded = 0  # messages queued so far
        self.healthy = True
        self._listeners: set[FlushListener] = set()
        self._answered = trio.Event()
        self._refused: deque[tuple[int, int]] = deque(maxlen=REFUSED_KEPT)  # (after, upto)
        self._after: list[Callable[[], None]] = []

    def request(self) -> int:
        return self.forwarded

    def poke(self) -> None:
        pass  # forwarding never waits to batch

    def call_after_flush(self, callback: Callable[[], None]) -> None:
        self._after.append(callback)

    async def wait(self, ticket: int) -> bool:
        while self.completed < ticket:
            await self._answered.wait()
        return not any(after < ticket <= upto for after, upto in self._refused)

    def listen(self, listener: FlushListener) -> None:
        self._listeners.add(listener)

    def unlisten(self, listener: FlushListener) -> None:
        self._listeners.discard(listener)

    def answered(self, confirmed_upto: int, failed_upto: int) -> None:
        """Tickets up to ``confirmed_upto`` are confirmed, the next ones up to ``failed_upto``
        refused."""
        if confirmed_upto > self.completed:
            self.completed = confirmed_upto
            for listener in list(self._listeners):
                listener.flushed(self)
        if failed_upto > self.completed:
            self._refused.append((self.completed, failed_upto))
            for listener in list(self._listeners):
                listener.flush_failed(self, failed_upto)
            self.completed = failed_upto
        answered, self._answered = self._answered, trio.Event()
        answered.set()
        after, self._after = self._after, []
        for callback in after:
            callback()


class Forwarder:
    """A follower partition's forwarded publishes (see the module doc)."""

    def __init__(self, key: str, leader: str, send: Send) -> None:
        self.key = key
        self.leader = leader
        self._send = send
        self.commit = ForwardedCommit()
        self._queued: list[Message] = []
        self._queued_bytes = 0  # their bodies'
        self.max_queued_bytes = MAX_QUEUED_BYTES
        self._start = 0  # the ticket before the first queued message
        self._queued_any = trio.Event()
        self._offsets: dict[OffsetKind, dict[str, int]] = {"tracked": {}, "group": {}}
        self._fences: dict[str, list[Any]] = {}  # by group: [member, generation]
        self._offsets_stored = trio.Event()

    def store_offset(
        self, kind: OffsetKind, name: str, offset: int, fence: GroupFence | None = None
    ) -> None:
        """Send an offset stored here to the leader (the latest of each, soon), with the
        member that committed it (a group's, in the cluster's assignment)."""
        self._offsets[kind][name] = offset
        if fence is not None:
            self._fences[name] = [fence.member, fence.generation]
        else:
            self._fences.pop(name, None)
        self._offsets_stored.set()

    async def run_offsets(self) -> None:
        """Send the offsets stored here to the leader until cancelled; one that cannot be
        sent is logged (the consumer's next store sends it again)."""
        while True:
            await self._offsets_stored.wait()
            self._offsets_stored = trio.Event()
            sent, self._offsets = self._offsets, {"tracked": {}, "group": {}}
            fences, self._fences = self._fences, {}
            try:
                await self._send(OFFSETS, {"partition": self.key, **sent, "fences": fences})
            except (Exception, trio.TooSlowError) as exc:
                log.warning(
                    "partition %s: offsets not sent to %s: %s: %s",
                    self.key,
                    self.leader,
                    type(exc).__name__,
                    exc,
                )

    def forward(self, messages: Sequence[Message]) -> list[Durability] | None:
        """Queue ``messages`` for the leader: what each one's confirm waits for (None: the
        queue is full, they are refused)."""
        size = sum(len(m.body) for m in messages)
        if self._queued_bytes + size > self.max_queued_bytes and self._queued:
            log.warning(
                "partition %s: %d publish(es) refused: %d bytes wait for %s already",
                self.key,
                len(messages),
                self._queued_bytes,
                self.leader,
            )
            return None
        self._queued_bytes += size
        self._queued.extend(messages)
        commit = self.commit
        commit.forwarded += len(messages)
        self._queued_any.set()
        return [(commit, commit.forwarded)] * len(messages)

    async def run(self) -> None:
        """Send the queued messages, a batch at a time, until cancelled (then refuse the rest)."""
        try:
            while True:
                await self._queued_any.wait()
                batch = self._queued[:MAX_BATCH]
                del self._queued[:MAX_BATCH]
                self._queued_bytes -= sum(len(m.body) for m in batch)
                if not self._queued:
                    self._queued_any = trio.Event()
                start, self._start = self._start, self._start + len(batch)
                taken = await self._send_batch(batch)
                self.commit.answered(start + taken, start + len(batch))
        finally:
            self.commit.healthy = False
            self.commit.answered(self.commit.completed, self.commit.forwarded)

    async def _send_batch(self, batch: list[Message]) -> int:
        body = {"partition": self.key, "messages": encode_messages(batch)}
        try:
            reply = await self._send(APPEND, body)
            taken = int(reply["taken"])
            error = reply.get("error")
        except (Exception, trio.TooSlowError) as exc:  # the link, the leader: nacks
            taken, error = 0, f"{type(exc).__name__}: {exc}"
        if error:
            log.info(
                "partition %s: %d forwarded publish(es) refused by %s: %s",
                self.key,
                len(batch) - taken,
                self.leader,
                error,
            )
        return max(0, min(taken, len(batch)))
