"""The stream service of one vhost: its streams as topics and partitions, for every protocol
that is not AMQP's own stream queue (the HTTP topic and management APIs, and through them the
command line and the Spark data source; the Kafka listener). In the shape of Kafka's
``ReplicaManager`` (produce, fetch, list offsets) beside its admin and offset calls: each
protocol is a thin codec over this.

What a topic is (a partitioned stream, or one stream queue) is ``topics.py``'s; the work of
each call is done by ``topics.py`` (declare, produce), ``reading.py`` (records one by one),
``bulk_read.py`` (columns and frames) and ``admin.py`` (offsets, groups, describe, delete,
grow, reconfigure), each over the topic's ``Partition``s; Kafka's topic config names are
``topic_config.py``'s. Failures are ``TopicError``s: ``NotFound``,
``InvalidRequest``, ``Conflict``, ``Unavailable``; what a protocol makes of them (an HTTP
status, a Kafka error code) is its business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio

from ...protocol.codec import FieldTable
from ...protocol.kafka.records import BatchHeader
from ..queue import Queue
from ..read_budget import Piece, ReadBody, ReadBudget
from ..vhost import VirtualHost
from . import admin, bulk_read, kafka_read, reading, topic_config, topics
from .admin import (
    RESET_TARGETS,
    GroupMember,
    GroupPartition,
    GroupSummary,
    PartitionInfo,
    PartitionOffsets,
    TopicSummary,
)
from .idempotence import DuplicateSequence, InvalidProducerEpoch, OutOfOrderSequence
from .partition import Partition, StorageInfo
from .queue import StreamQueue
from .reading import RecordRead
from .topic_config import ConfigValue, InvalidConfig
from .topics import (
    Conflict,
    ConsumerRecord,
    InvalidRequest,
    NotFound,
    ProducerRecord,
    TopicError,
    Unavailable,
    failed_log,
)

__all__ = [
    "RESET_TARGETS",
    "ConfigValue",
    "Conflict",
    "ConsumerRecord",
    "DuplicateSequence",
    "GroupMember",
    "GroupPartition",
    "GroupSummary",
    "InvalidConfig",
    "InvalidProducerEpoch",
    "InvalidRequest",
    "NotFound",
    "OutOfOrderSequence",
    "Partition",
    "PartitionInfo",
    "PartitionOffsets",
    "ProducerRecord",
    "RecordRead",
    "StorageInfo",
    "StreamService",
    "TopicError",
    "TopicSummary",
    "Unavailable",
    "partition_of",
]


def partition_of(queue: Queue) -> Partition | None:
    """The stream partition a queue holds (None: a classic queue)."""
    return queue.partition if isinstance(queue, StreamQueue) else None


class StreamService:
    """The streams of one vhost (see the module doc). Cheap to make: it holds the vhost only."""

    def __init__(self, vhost: VirtualHost) -> None:
        self.vhost = vhost

    # -- topics and partitions -----------------------------------------------------------------

    def partitions(self, topic: str) -> list[Partition]:
        """The topic's partitions, in order (``NotFound``: no such topic)."""
        return [queue.partition for queue in topics.partitions(self.vhost, topic)]

    def partition(self, topic: str, index: int) -> Partition:
        return topics.partition(self.vhost, topic, index).partition

    def queue_names(self, topic: str) -> list[str]:
        """The stream queues holding the topic's partitions, in order: what AMQP consumers
        consume, and what permissions are checked on."""
        return [queue.name for queue in topics.partitions(self.vhost, topic)]

    # -- produce and fetch ---------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        records: Sequence[ProducerRecord],
        *,
        producer: tuple[str, int] | None = None,
    ) -> list[tuple[int, int]] | None:
        """Append the records; once durable, where each landed: (partition, offset). With an
        idempotent ``producer`` (id, first sequence), None if every record was written
        before (``topics.produce``)."""
        return await topics.produce(self.vhost, topic, records, producer=producer)

    async def produce_kafka_batches(
        self, topic: str, partition: int, batches: Sequence[tuple[bytes, BatchHeader]]
    ) -> int:
        """Append Kafka record batches to a partition, each kept as produced; once durable,
        the first one's offset (``topics.produce_kafka_batches``)."""
        return await topics.produce_kafka_batches(self.vhost, topic, partition, batches)

    def kafka_batches(
        self, topic: str, index: int, offset: int, max_bytes: int, *, whole_first: bool = True
    ) -> bytes:
        """A partition's records from ``offset`` on as Kafka record batches, a Kafka
        producer's as stored (``kafka_read.read_batches``)."""
        partition = self.partition(topic, index)
        with failed_log(topic, index):
            return kafka_read.read_batches(partition, offset, max_bytes, whole_first=whole_first)

    def read(
        self,
        topic: str,
        partition: int,
        *,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        limit: int = 100,
        max_bytes: int = 1024 * 1024,
    ) -> list[ConsumerRecord]:
        """Records of a partition one by one, below its high watermark (``reading.read``)."""
        with failed_log(topic, partition):
            return reading.read(
                self.vhost,
                topic,
                partition,
                offset=offset,
                timestamp_ms=timestamp_ms,
                limit=limit,
                max_bytes=max_bytes,
            )

    async def record_read(
        self,
        topic: str,
        partition: int,
        *,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        limit: int = 100,
        max_bytes: int = 1024 * 1024,
    ) -> RecordRead:
        """``read`` taken a run at a time (``reading.RecordRead``), for a body that streams
        under the read budget; admitted first (``ReadBudget.admit``)."""
        await self.read_budget.admit()
        with failed_log(topic, partition):
            return reading.RecordRead(
                self.vhost,
                topic,
                partition,
                offset=offset,
                timestamp_ms=timestamp_ms,
                limit=limit,
                max_bytes=max_bytes,
            )

    @property
    def read_budget(self) -> ReadBudget:
        """The bytes reads may hold (the broker's; ``read_budget.py``): the reads below are
        admitted (``ReadBudget.admit``) before they take anything from the log."""
        return self.vhost.read_budget

    async def columns_body(
        self,
        topic: str,
        partition: int,
        *,
        offset: int,
        end: int | None,
        max_bytes: int,
        headers: bool,
    ) -> ReadBody:
        """A ``TQR1`` body: the records from ``offset`` in columns (``bulk_read.read_body``),
        built whole under a reservation of the read budget (its start, ``ReadBody.start``,
        builds it)."""
        await self.read_budget.admit()
        with failed_log(topic, partition):
            estimate = bulk_read.columns_estimate(
                self.vhost, topic, partition, offset=offset, end=end, max_bytes=max_bytes
            )

        async def build() -> bytes:
            with failed_log(topic, partition):
                return await bulk_read.read_body(
                    self.vhost,
                    topic,
                    partition,
                    offset=offset,
                    end=end,
                    max_bytes=max_bytes,
                    headers=headers,
                )

        return ReadBody(self.read_budget, [Piece(estimate, build)], None)

    async def fetch_body(
        self,
        topic: str,
        partition: int,
        *,
        offset: int,
        end: int | None = None,
        max_bytes: int,
        wait_until: float | None = None,
    ) -> ReadBody:
        """A ``TQF1`` body: the log's frames holding the records from ``offset`` on, as they
        lie on disk (``bulk_read.plan_frames``), streamed a chunk at a time under the read
        budget. With ``wait_until`` (Trio's clock), a fetch at the high watermark first waits
        for records until then (Kafka's ``fetch.max.wait.ms``) and answers empty if none
        came."""
        await self.read_budget.admit()
        if wait_until is not None:
            found = self.partition(topic, partition)
            if offset >= found.high_watermark and offset >= found.log_start_offset:
                await found.wait_beyond(offset, wait_until)
            await trio.lowlevel.checkpoint()
        with failed_log(topic, partition):
            plan = await bulk_read.plan_frames(
                self.vhost, topic, partition, offset=offset, end=end, max_bytes=max_bytes
            )
        return ReadBody(self.read_budget, plan.pieces(), plan.length)

    async def fetch(
        self,
        topic: str,
        partition: int,
        *,
        offset: int,
        end: int | None = None,
        max_bytes: int,
        wait_until: float | None = None,
    ) -> bytes:
        """``fetch_body``'s body, whole (for callers that want it in one piece)."""
        body = await self.fetch_body(
            topic, partition, offset=offset, end=end, max_bytes=max_bytes, wait_until=wait_until
        )
        return await body.read_all()

    # -- offsets -------------------------------------------------------------------------------

    def high_watermark(self, topic: str, partition: int) -> int:
        """Where reads of the partition stop now (the next offset a reader at the end gets)."""
        return self.partition(topic, partition).high_watermark

    def list_offsets(self, topic: str) -> list[PartitionOffsets]:
        """Each partition's earliest offset and high watermark."""
        return admin.offsets(self.vhost, topic)

    def offsets_for_timestamp(self, topic: str, timestamp_ms: int) -> list[int | None]:
        """Per partition, the first offset at or after ``timestamp_ms`` (None: none)."""
        return admin.offsets_for_timestamp(self.vhost, topic, timestamp_ms)

    def fetch_offsets(self, topic: str, group: str) -> list[GroupPartition]:
        """A group's committed offset on each partition (``NotFound``: it never read it)."""
        return admin.group(self.vhost, topic, group)

    def reset_targets(
        self,
        topic: str,
        group: str,
        to: str,
        value: int | None = None,
        *,
        only: Sequence[int] | None = None,
    ) -> list[tuple[int, int]]:
        """Where a reset would put a group (``admin.reset_targets``)."""
        return admin.reset_targets(self.vhost, topic, group, to, value, only=only)

    async def commit_offsets(
        self, topic: str, group: str, targets: Sequence[tuple[int, int]]
    ) -> None:
        """Commit (partition, offset) pairs as the group's offsets; returns once durable."""
        await admin.reset(self.vhost, topic, group, targets)

    # -- groups --------------------------------------------------------------------------------

    def groups_of(self, topic: str) -> list[GroupSummary]:
        return admin.groups_of(self.vhost, topic)

    def all_groups(self) -> list[GroupSummary]:
        return admin.all_groups(self.vhost)

    def group_members(self, topic: str, group: str) -> list[GroupMember]:
        return admin.members(self.vhost, topic, group)

    def group_state(self, topic: str, group: str) -> str:
        """Kafka's state name: ``Stable`` (members read the topic) or ``Empty``."""
        return admin.state(self.vhost, group, topics.partitions(self.vhost, topic))

    # -- topic administration ------------------------------------------------------------------

    async def declare(
        self,
        topic: str,
        count: int,
        arguments: FieldTable,
        configs: Mapping[str, str | None] | None = None,
    ) -> bool:
        """Declare a partitioned topic (True: created; False: it existed as asked), with
        stream ``arguments`` and Kafka's topic ``configs`` (``topic_config``: a name that is
        neither is ``InvalidConfig``)."""
        table = self.arguments_for(arguments, configs)
        return await topics.declare(self.vhost, topic, count, table)

    @staticmethod
    def arguments_for(
        arguments: FieldTable, configs: Mapping[str, str | None] | None = None
    ) -> FieldTable:
        """The stream arguments a topic declared with ``arguments`` and ``configs`` gets
        (``InvalidConfig`` for a name that is neither a stream argument nor a config)."""
        topic_config.check_arguments(arguments)
        return {**arguments, **topic_config.arguments_for(configs or {})}

    def configs(self, topic: str, *, max_message_bytes: int) -> list[ConfigValue]:
        """The topic's Kafka configs (``max_message_bytes``: the broker's limit, the default
        of ``max.message.bytes``)."""
        return topic_config.described(self.arguments(topic), max_message_bytes=max_message_bytes)

    async def alter_configs(
        self,
        topic: str,
        changes: Sequence[tuple[str, int, str | None]],
        *,
        validate_only: bool = False,
    ) -> None:
        """Apply (name, operation, value) changes to the topic's configs
        (``topic_config.altered``) on each partition (``admin.reconfigure``)."""
        table = topic_config.altered(self.arguments(topic), changes)
        if not validate_only:
            await admin.reconfigure(self.vhost, topic, table)

    def list_topics(self) -> list[TopicSummary]:
        return admin.list_topics(self.vhost)

    def describe(self, topic: str) -> list[PartitionInfo]:
        return admin.describe(self.vhost, topic)

    def arguments(self, topic: str) -> FieldTable:
        return admin.arguments(self.vhost, topic)

    async def delete(self, topic: str) -> int:
        """Delete the topic; how many partitions went."""
        return await admin.delete(self.vhost, topic)

    async def grow(self, topic: str, count: int) -> int:
        """Give the topic ``count`` partitions; the previous count."""
        return await admin.grow(self.vhost, topic, count)
