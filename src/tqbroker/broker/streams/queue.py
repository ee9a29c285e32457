"""Stream queues (``x-queue-type=stream``): RabbitMQ's streams over AMQP 0-9-1, on a stream
``Partition`` (https://www.rabbitmq.com/docs/streams).

Responsibilities:
- ``StreamQueue``: append every routed message to the stream's log (confirmed once the backend's
  flush made it durable); deliver to each consumer from its own position, starting where its
  ``x-stream-offset`` says (``first``, ``last``, ``next`` — the default —, an offset, a
  timestamp, an interval such as ``"1h"``); every delivery carries an ``x-stream-offset``
  header; acks (and nacks, rejects, requeues) only return prefetch credit: reading never removes
  anything;
- the consumer rules RabbitMQ enforces: manual acks, a per-consumer prefetch; ``basic.get`` and
  ``queue.purge`` are not supported;
- consumer groups (``x-stream-group``, Kafka's way; the assignment is ``groups.py``'s):
  only the member a partition is assigned to reads it, from the group's committed offset, which
  advances with that member's acks (a settled prefix: never past an unacked delivery) and is
  stored durably with the stream; a new group starts where the consumer's ``x-stream-offset``
  says, and that start is committed at once;
- only what is durable is read: deliveries (and ``last``/``next`` starts) stop at the
  partition's high watermark (``partition.py``), so no consumer ever sees an offset that a
  crash could give to another record; a flush wakes the readers;
- server-side offset tracking, LavinMQ's way: a consumer with a tag and
  ``x-stream-automatic-offset-tracking=true`` (or ``x-stream-offset`` null, which starts from
  ``first`` the first time) has its position stored durably as it acks, and resumes there when it
  consumes again under the same tag;
- retention per whole segment (``x-max-length-bytes``, ``x-max-age``), checked after appends and
  every ``RETENTION_CHECK_SECONDS`` on Trio's clock;
- compaction (``x-stream-cleanup-policy: compact``: the latest record per key — the routing key,
  or the ``x-stream-compaction-key-header`` header — is kept; tombstones, empty bodies, go
  ``x-stream-delete-retention`` after they were written, one day by default), checked as often
  as retention, run in a worker thread while deliveries go on (offsets never change: readers
  step over what compaction removed).

The stream's arguments are read from its typed ``QueueArguments`` (``broker/arguments.py``).

Over 400 lines as one job: the AMQP face of a stream (its consumers, their positions and
groups); the log is the ``Partition``'s, the offsets' parsing ``consumer_arguments.py``'s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Sequence
from typing import Final

import trio

from ... import clock
from ...backends.base import FlushFirst, Popped
from ...backends.streams import CompactionPolicy, CorruptLogError, StreamLog
from ...model import Message, with_long_header
from ...plugins.spec import Durability
from ...protocol.codec import FieldTable
from ...protocol.errors import AMQPError, ReplyCode
from ...protocol.kafka import compression
from ...protocol.kafka.records import BatchHeader
from ..arguments import QueueArguments
from ..consumer import DELIVER_BATCH_BYTES, Consumer, EncodedDelivery
from ..flusher import Flusher
from ..queue import Queue, QueueHost
from .compaction import compaction_policy
from .consumer_arguments import Start, StreamConsumerArguments
from .cursor import GroupCursor
from .groups import ConsumerGroups
from .partition import GroupFence, Partition

log = logging.getLogger(__name__)

RETENTION_CHECK_SECONDS: Final = 60.0
# Records read from the log per call while delivering (at most the consumer's credit).
READ_CHUNK: Final = 256
OFFSET_HEADER: Final = "x-stream-offset"


class StreamQueue(Queue):
    """A stream queue: a partition (an append-only log) that consumers read from their
    own positions (or their group's), never removing anything (see the module doc)."""

    def __init__(
        self,
        vhost: str,
        name: str,
        stream: StreamLog,
        *,
        host: QueueHost,
        backend_name: str,
        arguments: QueueArguments,
        flusher: Flusher | None,
        groups: ConsumerGroups | None = None,
    ) -> None:
        super().__init__(
            vhost,
            name,
            host=host,
            backend_name=backend_name,
            durable=True,
            exclusive_owner=None,
            auto_delete=False,
            arguments=arguments,
            flusher=flusher,
        )
        self.partition = Partition(stream, flusher)
        self.partition.add_reader(self)  # a cluster's high watermark moving wakes the actor
        self.partition.compress_batches(batch_codec(arguments.compression_type))
        self.max_bytes = arguments.max_length_bytes
        self.max_age_ms = arguments.max_age_ms
        self.compaction = _compaction(arguments)
        self.compactions = 0  # compaction passes finished
        self._compacting = False  # a compaction task runs
        self._nursery: trio.Nursery | None = None  # the actor's (``run``)
        self._positions: dict[Consumer, int] = {}  # the next offset each consumer reads
        self._tracked: set[Consumer] = set()  # consumers whose position the stream stores
        self.groups = groups if groups is not None else ConsumerGroups()
        self._group_of: dict[Consumer, str] = {}  # consumers that are group members
        self._cursors: dict[str, GroupCursor] = {}  # by group: who reads for it, from where
        self._arguments: dict[Consumer, StreamConsumerArguments] = {}  # typed, by consumer

    # -- the actor ---------------------------------------------------------------------------

    async def run(self) -> None:
        if self._stopped:
            return
        with trio.CancelScope() as self._cancel_scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.compaction is not None:
                    self._compacting = True
                    nursery.start_soon(self._compact)
                await self._deliver_loop()

    def reconfigure(self, arguments: QueueArguments) -> None:
        """Take new arguments (a topic's altered configs: ``topics.reconfigure``): retention
        and compaction apply from now on (retention at once); a new segment size from the
        next start, when the log opens with it."""
        self.arguments = arguments
        self.partition.compress_batches(batch_codec(arguments.compression_type))
        self.max_bytes = arguments.max_length_bytes
        self.max_age_ms = arguments.max_age_ms
        self.compaction = _compaction(arguments)
        if self.compaction is not None and not self._compacting and self._nursery is not None:
            self._compacting = True
            self._nursery.start_soon(self._compact)
        self.wake()

    async def _deliver_loop(self) -> None:
        while True:
            retention_due = (
                trio.current_time() + RETENTION_CHECK_SECONDS
                if self.max_age_ms is not None
                else math.inf
            )
            with trio.move_on_at(retention_due):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            self._apply_retention()
            try:
                self._dispatch()
            except CorruptLogError as exc:  # logged by the log, naming segment and position
                self.fail(exc)  # consumers cancelled, publishes refused; the broker goes on
                return

    async def _compact(self) -> None:
        """Compact now and then, in a worker thread, while the arguments ask for it;
        deliveries go on meanwhile."""
        try:
            await self._compact_while_asked()
        finally:
            self._compacting = False

    async def _compact_while_asked(self) -> None:
        while True:
            await trio.sleep(RETENTION_CHECK_SECONDS)
            policy = self.compaction
            if policy is None:
                return
            work = self.partition.compaction_work(policy, clock.now_ms())
            if work is None:
                continue
            try:
                result = await trio.to_thread.run_sync(work)
            except OSError as exc:  # e.g. a full disk: the stream stays as it was
                log.error("stream %r in vhost %r: cannot compact: %s", self.name, self.vhost, exc)
                continue
            removed = self.partition.finish_compaction(result)
            self.compactions += 1
            if removed:
                log.info(
                    "stream %r in vhost %r: compaction removed %d record(s)",
                    self.name,
                    self.vhost,
                    removed,
                )
            if self.flusher is not None:
                self.flusher.poke()  # the flush makes the swap durable

    def _apply_retention(self) -> None:
        if self.max_bytes is not None or self.max_age_ms is not None:
            removed = self.partition.apply_retention(
                max_bytes=self.max_bytes, max_age_ms=self.max_age_ms, now_ms=clock.now_ms()
            )
            if removed and self.flusher is not None:
                self.flusher.poke()  # the flush deletes the segments

    def _dispatch(self) -> None:
        for consumer in self.consumers:
            group = self._group_of.get(consumer)
            if group is None:
                self._positions[consumer] = self._deliver(consumer, self._positions[consumer])
                continue
            cursor = self._cursors.get(group)
            if cursor is not None and cursor.owner is consumer:  # else it waits its turn
                cursor.position = self._deliver(consumer, cursor.position, cursor)

    def _deliver(self, consumer: Consumer, position: int, cursor: GroupCursor | None = None) -> int:
        """Deliver from ``position`` while the consumer has credit; return the next position
        (and note each offset delivered in the group's ``cursor``). Records go out in batches
        (``DeliveryChannel.deliver_encoded``, at most the consumer's credit and about
        ``DELIVER_BATCH_BYTES``) as their parts lie in the log: no message is built for them."""
        partition = self.partition
        end = partition.high_watermark
        position = max(position, partition.log_start_offset)
        channel = consumer.channel
        while position < end:
            credit = consumer.credit()
            if credit <= 0:
                break
            try:
                # The next records there are: compaction leaves gaps.
                records = partition.read_many(position, min(credit, READ_CHUNK), end)
            except CorruptLogError:
                raise  # the log failed: so does the queue (``_deliver_loop``)
            except OSError as exc:  # storage trouble: try again on the next wake-up
                log.error("stream %r in vhost %r: cannot read: %s", self.name, self.vhost, exc)
                break
            if not records:
                break
            batch: list[EncodedDelivery] = []
            size = 0
            for record in records:
                offset = record.offset
                names, properties, body = record.parts()
                # Every delivery says where it is, as a long, as RabbitMQ sends it (spliced
                # into the stored properties: the headers' order and encoding as published).
                properties = with_long_header(properties, OFFSET_HEADER, offset)
                batch.append((offset, names, properties, body))
                if cursor is not None:
                    cursor.note(offset)
                size += len(body)
                if size >= DELIVER_BATCH_BYTES:  # credit again: the socket may be backed up
                    break
            position = offset + 1
            if not consumer.no_ack:
                consumer.unacked += len(batch)
            channel.deliver_encoded(consumer, batch)
        if position >= end and end < partition.log_end_offset and self.flusher is not None:
            self.flusher.wake_after_flush(self)  # more is written: go on once it is durable
        return position

    def stop(self) -> None:
        super().stop()
        self.partition.remove_reader(self)
        self.partition.close()  # fetches waiting for more return

    # -- messages ----------------------------------------------------------------------------

    @property
    def dead_letters_on_publish(self) -> bool:
        return False  # a stream keeps everything it takes

    def publish(self, message: Message) -> Durability:
        """Append; the confirm waits for the backend's next flush (fsync'd per its policy)."""
        durabilities, error = self.publish_run((message,))
        if error is not None:
            raise error  # OSError: the caller refuses the publish
        return durabilities[0]

    def publish_run(self, messages: Sequence[Message]) -> tuple[list[Durability], Exception | None]:
        """Append a run of messages at once (``Queue.publish_run``); their confirms wait for
        the backend's next flush."""
        _first, durabilities, error = self.partition.append(messages)
        return self._published(durabilities), error

    def publish_kafka_batch(
        self, exchange: str, batch: bytes, header: BatchHeader
    ) -> tuple[list[Durability], Exception | None]:
        """Append a Kafka producer's batch as produced (``Partition.append_kafka_batch``), as
        ``publish_run`` appends its messages."""
        _first, durabilities, error = self.partition.append_kafka_batch(exchange, batch, header)
        return self._published(durabilities), error

    def _published(self, durabilities: list[Durability]) -> list[Durability]:
        if not durabilities:
            return durabilities
        self.stats.publish += len(durabilities)
        if self.max_bytes is not None:
            self._wakeup.set()
        if self.consumers and self.flusher is not None:  # readers see them once durable
            self.flusher.wake_after_flush(self)
        return durabilities

    def get(self) -> Popped | FlushFirst | None:
        raise AMQPError(
            ReplyCode.NOT_IMPLEMENTED,
            f"basic.get not supported by stream queues {self._describe()}",
        )

    def ack(self, message_id: int, consumer: Consumer | None) -> None:
        self.ack_many([message_id], consumer)

    def ack_many(self, message_ids: list[int], consumer: Consumer | None) -> None:
        """An ack is credit: the consumer may receive one more message each; a tracked
        consumer's stored position moves (once) past the last; a group's commit moves once,
        after its cursor settled them all."""
        if consumer is None:
            return
        if consumer in self._tracked:
            stored = self.partition.tracked_offsets.get(consumer.tag, 0)
            self.partition.store_offset(consumer.tag, max(stored, max(message_ids) + 1))
        self._settle_many(message_ids, consumer, requeue=False)

    def requeue(self, message_id: int, consumer: Consumer | None) -> None:
        """A stream never takes a message back or drops it: nack, reject and requeue only give
        the credit back. A group's reader that requeues gets the message (and those after it)
        again, and its group's commit stays before it."""
        self._settle(message_id, consumer, requeue=True)

    def reject(self, message_id: int, consumer: Consumer | None) -> None:
        self._settle(message_id, consumer, requeue=False)

    def _settle(self, message_id: int, consumer: Consumer | None, *, requeue: bool) -> None:
        if consumer is not None:
            self._settle_many((message_id,), consumer, requeue=requeue)

    def _settle_many(
        self, message_ids: Sequence[int], consumer: Consumer, *, requeue: bool
    ) -> None:
        group = self._group_of.get(consumer)
        if group is not None:
            cursor = self._cursors.get(group)
            if cursor is not None and cursor.owner is consumer:
                for message_id in message_ids:
                    if requeue:
                        cursor.rewind(message_id)
                    else:
                        cursor.settle(message_id)
                self.partition.commit_group_offset(group, cursor.committed, cursor.fence)
        consumer.unacked -= len(message_ids)
        self._wakeup.set()
        if not consumer.unacked and consumer not in self._positions:
            self._tracked.discard(consumer)  # cancelled, and its last delivery settled

    def purge(self) -> int:
        what = f"queue.purge not supported by stream queues {self._describe()}"
        raise AMQPError(ReplyCode.NOT_IMPLEMENTED, what)

    @property
    def message_count(self) -> int:
        return self.partition.message_count

    # -- consumers ---------------------------------------------------------------------------

    def check_consumer(
        self, tag: str, *, no_ack: bool, prefetch_count: int, arguments: FieldTable
    ) -> None:
        if no_ack:
            raise AMQPError(
                ReplyCode.NOT_IMPLEMENTED,
                f"automatic acknowledgement not supported by stream queues {self._describe()}",
            )
        if not prefetch_count:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"consumer prefetch count is not set for '{self._describe()}'",  # RabbitMQ's
            )
        StreamConsumerArguments.parse(arguments, tag=tag, where=self._describe())

    def add_consumer(self, consumer: Consumer) -> None:
        parsed = StreamConsumerArguments.parse(
            consumer.arguments, tag=consumer.tag, where=self._describe()
        )
        self._arguments[consumer] = parsed
        if parsed.group is not None:
            self._group_of[consumer] = parsed.group
            super().add_consumer(consumer)
            self.groups.join(parsed.group, self, consumer)  # may make it the partition's reader
            return
        start = self._start_offset(parsed.start)
        if parsed.tracks_offset:
            self._tracked.add(consumer)
            stored = self.partition.tracked_offsets.get(consumer.tag)
            if stored is not None:  # it consumed before: go on after its last ack
                start = self.partition.clamp(stored)
        self._positions[consumer] = start
        super().add_consumer(consumer)

    def remove_consumers(self, gone: Collection[Consumer]) -> None:
        for consumer in gone:
            self._positions.pop(consumer, None)
            self._arguments.pop(consumer, None)
            if not consumer.unacked:  # else acks still to come move its stored position
                self._tracked.discard(consumer)
        super().remove_consumers(gone)
        for consumer in gone:
            group = self._group_of.pop(consumer, None)
            if group is not None:
                self.groups.leave(group, self, consumer)  # another member may take over

    def cancel_consumers(self) -> None:
        for consumer, group in list(self._group_of.items()):
            self.groups.leave(group, self, consumer)
        self._group_of.clear()
        super().cancel_consumers()

    # -- consumer groups (called by ``ConsumerGroup``) ---------------------------------------

    def assign(
        self, group: str, consumer: Consumer | None, fence: GroupFence | None = None
    ) -> None:
        """``consumer`` now reads this partition for ``group`` (None: nobody does), its
        commits fenced by ``fence`` (a cluster's assignment). It starts at the group's
        committed offset: what the previous reader left unacked is delivered again; a group
        new to the partition starts where the consumer's ``x-stream-offset`` says, committed
        at once so that no later reader starts past it."""
        if consumer is None:
            self._cursors.pop(group, None)
            return
        committed = self.partition.group_offsets.get(group)
        if committed is None:
            committed = self._start_offset(self._arguments[consumer].start)
            self.partition.commit_group_offset(group, committed, fence)
            if self.flusher is not None:
                self.flusher.poke()
        self._cursors[group] = GroupCursor(consumer, committed, fence)
        self._wakeup.set()

    def revoke(self, consumer: Consumer) -> None:
        """The group gave this partition to another member: cancel ``consumer`` here, telling
        its channel (``basic.cancel``) as Kafka tells a consumer of a revoked partition."""
        consumer.channel.consumer_cancelled(consumer)
        self.remove_consumer(consumer)

    def _start_offset(self, start: Start) -> int:
        """Where a consumer starts (its ``x-stream-offset``), clamped to the stream's first
        offset and its high watermark (``last`` is the last durable record)."""
        partition = self.partition
        first, end = partition.log_start_offset, partition.high_watermark
        kind = start.kind
        if kind == "first":
            return first
        if kind == "last":  # the last message written (RabbitMQ: the last chunk)
            return max(first, end - 1)
        if kind == "next":
            return end
        if kind == "offset":
            return partition.clamp(start.value)
        if kind == "timestamp":
            return partition.offset_for_timestamp(start.value)
        return partition.offset_for_timestamp(clock.now_ms() - start.value)  # "ago"

    def _describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost}'"


def batch_codec(compression_type: str | None) -> int:
    """The codec a stream's own batches are stored with (``x-stream-compression-type``,
    Kafka's ``compression.type``): none for ``producer`` (Kafka producers' batches are kept as
    produced either way) and ``uncompressed``."""
    if compression_type in (None, "producer", "uncompressed"):
        return compression.NONE
    return compression.BY_NAME[compression_type]


def _compaction(arguments: QueueArguments) -> CompactionPolicy | None:
    """The compaction policy the arguments ask for (None: no compaction)."""
    policy = arguments.cleanup_policy
    if policy is None or "compact" not in policy:
        return None
    grace_ms = arguments.delete_retention_ms
    if grace_ms is None:
        return compaction_policy(arguments.compaction_key_header)
    return compaction_policy(arguments.compaction_key_header, grace_ms)
