"""Topics: the Kafka view of streams, for the HTTP API and the command line.

A topic ``T`` is either a partitioned stream — an exchange ``T`` whose bindings lead to stream
queues; the one-step declaration makes an ``x-key-partition`` exchange and stream queues
``T-0`` .. ``T-(N-1)`` bound with the keys ``"0"`` .. ``"N-1"`` — or a stream queue ``T`` (a
topic of one partition).

Responsibilities:
- find a topic's partitions, in order (``partitions``);
- declare a partitioned topic in one step, idempotently (``declare``);
- produce records: a key picks the partition through the topic's exchange, exactly as an AMQP
  publish with that routing key would; wait until they are durable (a publisher confirm's
  guarantee); say where each landed (partition, offset);
- idempotent producers: each record of a write with a producer id has a sequence number (the
  write's first one, then one more per record); records whose sequence the producer already
  wrote are skipped, so a retried or replayed write lands once however it is cut into requests
  (the next sequence expected is kept by each partition the write put records in, durable
  with them: ``Partition.record_producer``; a write expects the highest of them);
- Kafka producers' record batches, each kept as produced (``produce_kafka_batches``);

Reading records one by one is ``reading.py``'s, in columns (``ReadBatch``) ``bulk_read.py``'s;
offsets, groups and the administration of topics (list, describe, delete, grow) are
``admin.py``'s.

Failures are ``TopicError``s, one subclass per kind: ``NotFound`` (no such topic, partition or
group), ``InvalidRequest`` (arguments out of range, a record that cannot be written),
``Conflict`` (a declaration that contradicts what exists) and ``Unavailable`` (storage that
cannot write). What a caller makes of them (an HTTP status, an exit code) is its business.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import cast

import attrs
import trio

from ... import clock
from ...backends.streams import CorruptLogError
from ...model import Message
from ...protocol.codec import FieldTable
from ...protocol.errors import AMQPError, DecodeError, ReplyCode
from ...protocol.kafka.records import BatchHeader
from ...protocol.methods import BasicProperties
from ..declaring import open_and_declare_queue
from ..exchange import Exchange
from ..pacing import Pacer
from ..vhost import VirtualHost
from .durability import Durability
from .groups import natural_key
from .idempotence import state_key
from .queue import StreamQueue

log = logging.getLogger(__name__)

PARTITION_EXCHANGE_TYPE = "x-key-partition"
MAX_READ = 10_000
# The HTTP API's producers have no epochs (Kafka's idempotent producers do): theirs is 0.
HTTP_PRODUCER_EPOCH = 0
# How long the answer to a repeated Kafka batch waits for the first one to be durable.
REPEAT_WAIT = 30.0
MAX_READ_BYTES = 64 * 1024 * 1024
_PERSISTENT = BasicProperties(delivery_mode=2)
_PERSISTENT_RAW = _PERSISTENT.encode()


class TopicError(Exception):
    """A topic operation that cannot be done; ``message`` says why (for the user)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(TopicError):
    """No such topic, partition or consumer group."""


class InvalidRequest(TopicError):
    """Arguments out of range, or a record that cannot be written."""


class Conflict(TopicError):
    """A declaration that contradicts what exists."""


class Unavailable(TopicError):
    """Storage that cannot write, or cannot make a write durable; a partition whose log
    failed (a damaged frame: ``failed_log``)."""


@contextlib.contextmanager
def failed_log(topic: str, partition: int) -> Iterator[None]:
    """A read of a partition whose log failed (a damaged frame) is ``Unavailable``."""
    try:
        yield
    except CorruptLogError as exc:
        raise Unavailable(f"partition {partition} of topic '{topic}' failed: {exc}") from None


@attrs.frozen
class ProducerRecord:
    value: bytes
    key: str = ""
    headers: FieldTable = attrs.field(factory=dict)
    partition: int | None = None  # None: the key decides
    timestamp_ms: int | None = None  # None: now (a Kafka producer's own timestamp otherwise)


@attrs.frozen
class ConsumerRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: str
    headers: FieldTable
    value: bytes


def partitions(vhost: VirtualHost, topic: str) -> list[StreamQueue]:
    """The topic's partitions in order (``NotFound`` if there is no such topic)."""
    exchange = vhost.exchanges.get(topic)
    if exchange is not None:
        bound = [
            (key, queue)
            for (queue, key, _args) in exchange.bindings
            if isinstance(queue, StreamQueue)
        ]
        if exchange.type_name == PARTITION_EXCHANGE_TYPE:
            bound.sort(key=lambda pair: int(pair[0]) if pair[0].isdigit() else -1)
            found = [queue for _key, queue in bound]
        else:
            found = sorted({queue for _key, queue in bound}, key=natural_key)
        if found:
            return found
    queue = vhost.queues.get(topic)
    if isinstance(queue, StreamQueue):
        return [queue]
    raise NotFound(
        f"no topic '{topic}' in vhost '{vhost.name}' (no stream queue or "
        "exchange bound to stream queues has that name)",
    )


def partition(vhost: VirtualHost, topic: str, index: int) -> StreamQueue:
    found = partitions(vhost, topic)
    _check_partition(topic, index, len(found))
    return found[index]


def _check_partition(topic: str, index: int, count: int) -> None:
    if not 0 <= index < count:
        raise NotFound(f"topic '{topic}' has partitions 0..{count - 1}, not {index}")


async def declare(vhost: VirtualHost, topic: str, count: int, arguments: FieldTable) -> bool:
    """Declare a partitioned stream of ``count`` partitions (``arguments``: the streams'
    ``x-`` arguments, such as ``x-max-age``); True if it was created, False if it existed
    as asked. New partitions open in a worker thread; returns once the topology is written."""
    if not 1 <= count <= 1000:
        raise InvalidRequest(f"partitions must be between 1 and 1000 (got {count})")
    if PARTITION_EXCHANGE_TYPE not in vhost.exchange_types:
        raise InvalidRequest(
            f"partitioned topics need the {PARTITION_EXCHANGE_TYPE} exchange type: install "
            "tqbroker-partitioner (plugins/partitioner)",
        )
    if not topic or "/" in topic or len(f"{topic}-{count - 1}".encode()) > 255:
        raise InvalidRequest(
            "a topic name must be non-empty, without '/', and short enough for its "
            "partitions' queue names (255 bytes)",
        )
    names = [f"{topic}-{n}" for n in range(count)]
    queue_arguments: FieldTable = {**arguments, "x-queue-type": "stream"}
    existing = vhost.exchanges.get(topic)
    if existing is not None:  # its shape first: a partition count is what differs most often
        have = [q.name for q in _bound(vhost, topic)]
        if existing.type_name == PARTITION_EXCHANGE_TYPE and have and have != names:
            raise Conflict(
                f"topic '{topic}' exists with another shape than {count} partitions: it has "
                f"{len(have)} (a topic grows with PATCH /topics/{topic} or tqbroker-ctl "
                "topics alter --partitions)"
            )
        if existing.type_name != PARTITION_EXCHANGE_TYPE or have != names:
            raise Conflict(f"topic '{topic}' exists with another shape than {count} partitions")
    since = vhost.definitions.mark()
    try:
        # Partitions that exist must be streams with these arguments (a redeclare checks
        # that), before anything is created: a refused declaration leaves nothing behind.
        for name in names:
            if name in vhost.queues:
                await _declare_stream(vhost, name, queue_arguments)
        if existing is not None:
            return False
        for name in names:
            await _declare_stream(vhost, name, queue_arguments)
        vhost.declare_exchange(
            topic,
            PARTITION_EXCHANGE_TYPE,
            passive=False,
            durable=True,
            auto_delete=False,
            internal=False,
            arguments={},
        )
        for n, name in enumerate(names):
            vhost.bind_queue(name, topic, str(n), {}, None)
    except AMQPError as exc:
        raise _topic_error(exc) from None
    try:
        await vhost.definitions.wait(since)
    except AMQPError as exc:
        raise Unavailable(exc.text) from None
    return True


def _topic_error(exc: AMQPError) -> TopicError:
    """A refused declaration: a contradiction or refused argument (409), else 400."""
    if exc.code == ReplyCode.PRECONDITION_FAILED:
        return Conflict(exc.text)
    return InvalidRequest(exc.text)


async def declare_partition(
    vhost: VirtualHost, topic: str, index: int, name: str, arguments: FieldTable
) -> None:
    """Add stream queue ``name`` as partition ``index`` of the partitioned topic (growing it)."""
    try:
        await _declare_stream(vhost, name, arguments)
        vhost.bind_queue(name, topic, str(index), {}, None)
    except AMQPError as exc:
        raise _topic_error(exc) from None


async def _declare_stream(vhost: VirtualHost, name: str, arguments: FieldTable) -> None:
    await open_and_declare_queue(
        vhost,
        name,
        passive=False,
        durable=True,
        exclusive=False,
        auto_delete=False,
        arguments=arguments,
        owner=None,
    )


def _bound(vhost: VirtualHost, topic: str) -> list[StreamQueue]:
    try:
        return partitions(vhost, topic)
    except NotFound:
        return []


async def produce(
    vhost: VirtualHost,
    topic: str,
    records: Sequence[ProducerRecord],
    *,
    producer: tuple[str, int] | None = None,
) -> list[tuple[int, int]] | None:
    """Append the records; once they are durable, return where each landed: (partition,
    offset). With ``producer`` (id, sequence of the first record), records whose sequence is
    below the next one that producer's writes expect are skipped (written before); None if
    every record was."""
    found = partitions(vhost, topic)
    for record in records:  # before anything is written
        if record.partition is not None:
            _check_partition(topic, record.partition, len(found))
    skip = 0
    expected = None
    if producer is not None:
        expected = _expected_sequence(found, producer[0])
        if expected is not None and producer[1] < expected:
            skip = min(len(records), expected - producer[1])
        if skip == len(records):
            return None
    index = {queue: n for n, queue in enumerate(found)}
    exchange = vhost.exchanges.get(topic)
    landed: list[tuple[int, int]] = []
    records = records[skip:]
    with Durability() as durability:
        await _append(vhost, topic, records, found, index, exchange, landed, durability)
        if producer is not None:  # durable with the records: the same flush writes both
            following = producer[1] + skip + len(records)
            following = max(following, expected or 0)
            for n in sorted({n for n, _offset in landed}):  # kept with the records it wrote
                found[n].partition.record_producer(producer[0], HTTP_PRODUCER_EPOCH, following)
        await _made_durable(durability, topic)
    return landed


async def produce_kafka_batches(
    vhost: VirtualHost, topic: str, partition: int, batches: Sequence[tuple[bytes, BatchHeader]]
) -> int:
    """Append Kafka record batches (each its bytes as produced and its records, checked by
    ``records.check_batch``) to a partition, in order, each kept as produced
    (``StreamQueue.publish_kafka_batch``); once they are durable, return the first one's
    offset. An idempotent producer's batch is checked against the producer's state
    (``idempotence.py``: a ``SequenceError`` refuses it and those after it); one written
    before is not appended again, and answered with its offset once it is durable."""
    found = partitions(vhost, topic)
    _check_partition(topic, partition, len(found))
    target = found[partition]
    stream, recent = target.partition, target.partition.kafka_producers
    exchange = vhost.exchanges.get(topic)
    source = exchange.name if exchange is not None else ""
    first: int | None = None
    repeated = -1  # the last offset of the repeats answered: durable before the answer
    with Durability() as durability:
        for raw, header in batches:
            producer, count = header.producer_id, header.record_count
            epoch, sequence = header.producer_epoch, header.base_sequence
            if producer >= 0:
                state = stream.producer_state(state_key(producer))
                duplicate = recent.check(state, producer, epoch, sequence, count)
                if duplicate is not None:
                    first = duplicate.offset if first is None else first
                    repeated = max(repeated, duplicate.last_offset)
                    continue
            if not target.accepting:
                raise Unavailable(f"topic '{topic}': partition {partition} takes no records")
            offset = stream.log_end_offset
            tickets, error = target.publish_kafka_batch(source, raw, header)
            if error is not None or not tickets:
                raise Unavailable(f"topic '{topic}': partition storage cannot write")
            durability.add([ticket for ticket in tickets[-1:] if ticket is not None])
            first = offset if first is None else first
            if producer >= 0:  # durable with the batch: the same flush writes both
                state = recent.appended(producer, epoch, sequence, count, offset)
                stream.record_producer(state_key(producer), state.epoch, state.next_sequence)
        await _made_durable(durability, topic)
    deadline = trio.current_time() + REPEAT_WAIT
    if repeated >= stream.high_watermark and not await stream.wait_beyond(repeated, deadline):
        raise Unavailable(f"topic '{topic}': the write could not be made durable")
    assert first is not None  # at least one batch
    return first


async def _made_durable(durability: Durability, topic: str) -> None:
    """Wait for the write's flushes; ``Unavailable`` if one failed."""
    if not await durability.wait():
        raise Unavailable(f"topic '{topic}': the write could not be made durable")


def _expected_sequence(found: Sequence[StreamQueue], producer: str) -> int | None:
    """The next sequence a producer's writes to the topic expect: the highest any partition
    it wrote to keeps (None: it never wrote to the topic)."""
    states = [q.partition.producer_state(producer) for q in found]
    kept = [state.next_sequence for state in states if state is not None]
    return max(kept) if kept else None


async def _append(
    vhost: VirtualHost,
    topic: str,
    records: Sequence[ProducerRecord],
    found: list[StreamQueue],
    index: dict[StreamQueue, int],
    exchange: Exchange | None,
    landed: list[tuple[int, int]],
    durability: Durability,
) -> None:
    """Append each record to its partition, saying in ``landed`` where, giving way to other
    clients now and then (a large batch)."""
    source, now_ms = (exchange.name if exchange is not None else ""), clock.now_ms()
    routing, pacer = vhost.routing, Pacer()
    for record in records:
        message = _message(source, record, now_ms)
        if record.partition is not None or exchange is None:
            target = found[record.partition or 0]
            offset = target.partition.log_end_offset
            tickets, refused = routing.enqueue([target], message)
        else:  # through the topic's exchange, as an AMQP publish with the key would go
            tickets, refused, _, taken = routing.publish(
                exchange, message, to=_FirstPartition(index), sender_selected=False
            )
            if not taken:
                raise InvalidRequest(f"topic '{topic}' routes key {record.key!r} to no partition")
            target = cast(StreamQueue, taken[0])
            offset = target.partition.log_end_offset - 1
        if refused:
            raise Unavailable(f"topic '{topic}': partition storage cannot write")
        durability.add(tickets)
        landed.append((index[target], offset))
        await pacer.step()


class _FirstPartition:
    """A ``Routing.publish`` filter that takes the first of the topic's partitions the key
    routes to: a record lands in one partition, as in Kafka, however the exchange is bound."""

    __slots__ = ("partitions", "taken")

    def __init__(self, partitions: dict[StreamQueue, int]) -> None:
        self.partitions = partitions
        self.taken = False

    def __call__(self, destination: object) -> bool:
        if self.taken or destination not in self.partitions:
            return False
        self.taken = True
        return True


def _message(exchange: str, record: ProducerRecord, now_ms: int) -> Message:
    """The message a record becomes (``InvalidRequest`` if its headers cannot be encoded).
    Records without headers share one encoding of their (persistent) properties."""
    if record.timestamp_ms is not None:
        now_ms = record.timestamp_ms
    if not record.headers:
        return Message(exchange, record.key, _PERSISTENT_RAW, record.value, _PERSISTENT, now_ms)
    properties = BasicProperties(headers=dict(record.headers), delivery_mode=2)
    try:
        raw = properties.encode()
    except (ValueError, OverflowError) as exc:
        raise InvalidRequest(f"cannot encode the headers: {exc}") from None
    return Message(exchange, record.key, raw, record.value, properties, now_ms)


def stored_headers(message: Message) -> FieldTable:
    """A stored message's headers; ones that no longer decode (stored by an earlier version:
    nested deeper than AMQP allows) are shown as ``{"x-undecodable-headers": <why>}`` rather than
    failing the whole read."""
    try:
        return message.properties.headers or {}
    except DecodeError as exc:
        return {"x-undecodable-headers": str(exc)}
