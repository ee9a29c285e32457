"""Administering topics and consumer groups, as ``kafka-topics`` and ``kafka-consumer-groups``
do: list and describe topics, delete one, grow its partitions, give its partitions new
stream arguments (altered configs: ``reconfigure``); each partition's offsets
(earliest, latest, first at or after a time); list and describe groups (committed offsets,
lag, readers) and reset a group's committed offsets.

Where things are kept (see ``topics.py`` for what a topic is):
- a group's committed offset on a partition is in that partition's ``StreamLog.group_offsets``
  (the next offset it reads), moved by its reader's acks and stored with the stream at the
  next flush; a group exists on a topic while it has an offset there or live members;
- the live members are the vhost's ``ConsumerGroups``: a group there with a consumer on one of
  the topic's partitions is ``Stable`` (Kafka's state name), else ``Empty``.

A reset writes new committed offsets where a member would resume (``StreamQueue.assign`` reads
them); it is refused while the group has members, as Kafka refuses it, so no reader's cursor
disagrees with them. Failures are ``topics.TopicError``s.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ...protocol.codec import FieldTable
from ...protocol.errors import AMQPError
from ..arguments import QueueArguments, check_queue_arguments
from ..vhost import VirtualHost
from .partition import make_durable
from .queue import StreamQueue
from .topics import (
    PARTITION_EXCHANGE_TYPE,
    Conflict,
    InvalidRequest,
    NotFound,
    Unavailable,
    declare_partition,
    partitions,
)

MAX_PARTITIONS = 1000
RESET_TARGETS = ("earliest", "latest", "offset", "datetime")


@attrs.frozen
class TopicSummary:
    name: str
    partitions: int
    partitioned: bool  # an exchange and its stream queues (else one stream queue)


@attrs.frozen
class PartitionInfo:
    partition: int
    queue: str
    log_start: int
    log_end: int  # the high watermark
    messages: int
    segments: int | None  # None: the backend does not say
    bytes: int | None


@attrs.frozen
class GroupSummary:
    group: str
    topic: str
    members: int
    state: str  # Kafka's: Stable (members), Empty (only offsets)


@attrs.frozen
class GroupMember:
    partition: int
    consumer_tag: str
    channel: object  # the member: its channel (the server knows its connection)


def list_topics(vhost: VirtualHost) -> list[TopicSummary]:
    """Partitioned topics (``x-key-partition`` exchanges bound to stream queues) and the stream
    queues that are not one of their partitions, by name."""
    found: dict[str, TopicSummary] = {}
    inside: set[str] = set()
    for exchange in list(vhost.exchanges.values()):
        if exchange.type_name != PARTITION_EXCHANGE_TYPE:
            continue
        queues = [q for (q, _key, _args) in exchange.bindings if isinstance(q, StreamQueue)]
        if queues:
            found[exchange.name] = TopicSummary(exchange.name, len(set(queues)), True)
            inside.update(q.name for q in queues)
    for queue in list(vhost.queues.values()):
        if isinstance(queue, StreamQueue) and queue.name not in inside and queue.name not in found:
            found[queue.name] = TopicSummary(queue.name, 1, False)
    return [found[name] for name in sorted(found)]


def describe(vhost: VirtualHost, topic: str) -> list[PartitionInfo]:
    """Each partition's log: start, end, messages, and segments and bytes when the backend's log
    says (the built-in one does)."""
    result = []
    for n, queue in enumerate(partitions(vhost, topic)):
        found = queue.partition
        storage = found.storage_info()
        result.append(
            PartitionInfo(
                n,
                queue.name,
                found.log_start_offset,
                found.high_watermark,
                found.message_count,
                storage.segments,
                storage.bytes,
            )
        )
    return result


def arguments(vhost: VirtualHost, topic: str) -> FieldTable:
    """The arguments the topic's (first) partition was declared with."""
    return dict(partitions(vhost, topic)[0].arguments.table)


async def delete(vhost: VirtualHost, topic: str) -> int:
    """Delete the topic's partitions and its exchange (``NotFound`` if there is no such topic);
    returns once the definitions are written. Returns how many partitions went."""
    found = partitions(vhost, topic)
    exchange = vhost.exchanges.get(topic)
    since = vhost.definitions.mark()
    try:
        for queue in found:
            vhost.delete_queue(queue.name, if_unused=False, if_empty=False, owner=None)
        if exchange is not None and exchange.type_name == PARTITION_EXCHANGE_TYPE:
            vhost.delete_exchange(topic, if_unused=False)
    except AMQPError as exc:
        raise Unavailable(exc.text) from None
    try:
        await vhost.definitions.wait(since)
    except AMQPError as exc:
        raise Unavailable(exc.text) from None
    return len(found)


async def reconfigure(vhost: VirtualHost, topic: str, table: FieldTable) -> None:
    """Give each of the topic's partitions the stream arguments ``table`` (its configs
    altered: ``topic_config.altered``), checked as a declaration checks them
    (``InvalidRequest``); retention and compaction change at once (``StreamQueue.reconfigure``);
    returns once the definitions hold them."""
    found = partitions(vhost, topic)
    table = {**table, "x-queue-type": "stream"}
    try:
        check_queue_arguments(found[0].name, vhost.name, table)
    except AMQPError as exc:
        raise InvalidRequest(exc.text) from None
    arguments = QueueArguments.parse(table)
    since = vhost.definitions.mark()
    for queue in found:
        queue.reconfigure(arguments)
    vhost.definitions.changed()
    try:
        await vhost.definitions.wait(since)
    except AMQPError as exc:
        raise Unavailable(exc.text) from None


async def grow(vhost: VirtualHost, topic: str, count: int) -> int:
    """Give a partitioned topic ``count`` partitions (Kafka's ``--alter --partitions``: growing
    only); the new ones get the first partition's arguments. Returns the previous count. As in
    Kafka, keys hash over the new count from now on."""
    found = partitions(vhost, topic)
    exchange = vhost.exchanges.get(topic)
    if exchange is None or exchange.type_name != PARTITION_EXCHANGE_TYPE:
        raise InvalidRequest(
            f"topic '{topic}' is a single stream queue, not a partitioned topic: its "
            "partitions cannot be changed"
        )
    current = len(found)
    if count == current:
        raise InvalidRequest(f"Topic already has {current} partitions.")
    if count < current:
        raise InvalidRequest(
            f"Topic currently has {current} partitions, which is higher than the requested {count}."
        )
    if count > MAX_PARTITIONS:
        raise InvalidRequest(f"partitions must be between 1 and {MAX_PARTITIONS} (got {count})")
    names = [f"{topic}-{n}" for n in range(current, count)]
    taken = [name for name in names if name in vhost.queues]
    if taken:
        raise Conflict(f"cannot add partition queue '{taken[0]}': a queue has that name")
    table = {**found[0].arguments.table, "x-queue-type": "stream"}
    since = vhost.definitions.mark()
    for n, name in enumerate(names, start=current):
        await declare_partition(vhost, topic, n, name, table)
    try:
        await vhost.definitions.wait(since)
    except AMQPError as exc:
        raise Unavailable(exc.text) from None
    return current


# -- offsets -------------------------------------------------------------------------------


@attrs.frozen
class PartitionOffsets:
    partition: int
    queue: str  # the stream queue holding it (what AMQP consumers consume)
    earliest: int
    latest: int  # the high watermark, where reads stop


@attrs.frozen
class GroupPartition:
    partition: int
    committed: int | None  # the next offset the group reads; None: it never read this one
    latest: int
    # The consumer tag of the member reading it now (in a cluster, one on another node: its
    # member id, ``node/run/number``).
    reader: str | None

    @property
    def lag(self) -> int | None:
        return None if self.committed is None else max(0, self.latest - self.committed)


def offsets(vhost: VirtualHost, topic: str) -> list[PartitionOffsets]:
    return [
        PartitionOffsets(
            n, queue.name, queue.partition.log_start_offset, queue.partition.high_watermark
        )
        for n, queue in enumerate(partitions(vhost, topic))
    ]


def offsets_for_timestamp(vhost: VirtualHost, topic: str, timestamp_ms: int) -> list[int | None]:
    """Per partition, the first offset whose timestamp is at or after ``timestamp_ms``; None
    where there is none (Kafka's offsetsForTimes)."""
    found = []
    for queue in partitions(vhost, topic):
        offset = queue.partition.offset_for_timestamp(timestamp_ms)
        found.append(offset if offset < queue.partition.high_watermark else None)
    return found


def group(vhost: VirtualHost, topic: str, name: str) -> list[GroupPartition]:
    """A consumer group's position on each partition (``NotFound`` if the group never read
    this topic)."""
    found = partitions(vhost, topic)
    live = vhost.consumer_groups.groups.get(name)
    owners = live.owners if live is not None else {}
    result = []
    groups = vhost.consumer_groups
    for n, queue in enumerate(found):
        owner = owners.get(queue)
        result.append(
            GroupPartition(
                n,
                queue.partition.group_offsets.get(name),
                queue.partition.high_watermark,
                owner.tag if owner is not None else groups.read_elsewhere(name, queue),
            )
        )
    reading = _members(vhost, name, found) > 0
    if not reading and all(p.committed is None for p in result):
        raise NotFound(f"no consumer group '{name}' on topic '{topic}'")
    return result


# -- consumer groups ---------------------------------------------------------------------------


def _members(vhost: VirtualHost, group: str, queues: Sequence[StreamQueue]) -> int:
    """How many members of ``group`` consume one of ``queues``: channels here, and in a
    cluster the members elsewhere that read one of them."""
    groups = vhost.consumer_groups
    live = groups.groups.get(group)
    here = {c.channel for q in queues for c in live.subscriptions.get(q, [])} if live else set()
    elsewhere = {groups.read_elsewhere(group, q) for q in queues} - {None}
    return len(here) + len(elsewhere)


def state(vhost: VirtualHost, group: str, queues: Sequence[StreamQueue]) -> str:
    return "Stable" if _members(vhost, group, queues) else "Empty"


def groups_of(vhost: VirtualHost, topic: str) -> list[GroupSummary]:
    """The groups with offsets or members on the topic, by name."""
    queues = partitions(vhost, topic)
    names: set[str] = set()
    for queue in queues:
        names.update(queue.partition.group_offsets)
    for name, live in vhost.consumer_groups.groups.items():
        if any(q in live.subscriptions for q in queues):
            names.add(name)
    for name in vhost.consumer_groups.assignments:
        if _members(vhost, name, queues):
            names.add(name)
    return [
        GroupSummary(name, topic, _members(vhost, name, queues), state(vhost, name, queues))
        for name in sorted(names)
    ]


def all_groups(vhost: VirtualHost) -> list[GroupSummary]:
    """Every group on every topic of the vhost (a group reading two topics is listed twice)."""
    return [g for t in list_topics(vhost) for g in groups_of(vhost, t.name)]


def members(vhost: VirtualHost, topic: str, group: str) -> list[GroupMember]:
    """Who reads each partition for the group now (partitions without a reader left out)."""
    live = vhost.consumer_groups.groups.get(group)
    if live is None:
        return []
    result = []
    for n, queue in enumerate(partitions(vhost, topic)):
        owner = live.owners.get(queue)
        if owner is not None:
            result.append(GroupMember(n, owner.tag, owner.channel))
    return result


def reset_targets(
    vhost: VirtualHost,
    topic: str,
    group: str,
    to: str,
    value: int | None = None,
    *,
    only: Sequence[int] | None = None,
) -> list[tuple[int, int]]:
    """Where a reset would put the group on each partition (``only``: these partitions), as
    Kafka computes it: ``earliest``, ``latest``, ``offset`` (``value``, clamped to what the
    partition holds) or ``datetime`` (``value`` in ms: the first offset at or after it, else
    the end). Refused (``Conflict``) while the group has members on the topic."""
    queues = partitions(vhost, topic)
    if _members(vhost, group, queues):
        raise Conflict(
            f"Assignments can only be reset if the group '{group}' is inactive, but the "
            "current state is Stable."
        )
    if to not in RESET_TARGETS:
        raise InvalidRequest(f"'to' must be one of {', '.join(RESET_TARGETS)} (got {to!r})")
    if to in ("offset", "datetime") and value is None:
        raise InvalidRequest(f"a reset to {to} needs a 'value'")
    chosen = range(len(queues)) if only is None else only
    for n in chosen:
        if not 0 <= n < len(queues):
            raise NotFound(f"topic '{topic}' has partitions 0..{len(queues) - 1}, not {n}")
    result = []
    for n in sorted(set(chosen)):
        found = queues[n].partition
        first, end = found.log_start_offset, found.high_watermark
        if to == "earliest":
            target = first
        elif to == "latest":
            target = end
        elif to == "offset":
            assert value is not None
            target = min(max(value, first), end)
        else:
            assert value is not None
            target = found.offset_for_timestamp(value)
        result.append((n, target))
    return result


async def reset(
    vhost: VirtualHost, topic: str, group: str, targets: Sequence[tuple[int, int]]
) -> None:
    """Commit ``targets`` (from ``reset_targets``, without an await between: no member can
    have joined) as the group's offsets; returns once they are durable."""
    queues = partitions(vhost, topic)
    for n, offset in targets:
        queues[n].partition.commit_group_offset(group, offset)
    if not await make_durable([queues[n].partition for n, _offset in targets]):
        raise Unavailable(f"the offsets of group '{group}' could not be made durable")
