"""Stream queues (``x-queue-type=stream``): RabbitMQ's streams over AMQP 0-9-1, on the log
backend's segmented log (https://www.rabbitmq.com/docs/streams).

Responsibilities:
- ``StreamQueue``: append every routed message to the stream's log (confirmed once the backend's
  flush made it durable); deliver to each consumer from its own position, starting where its
  ``x-stream-offset`` says (``first``, ``last``, ``next`` — the default —, an offset, a
  timestamp, an interval such as ``"1h"``); every delivery carries an ``x-stream-offset``
  header; acks (and nacks, rejects, requeues) only return prefetch credit: reading never removes
  anything;
- the consumer rules RabbitMQ enforces: manual acks, a per-consumer prefetch; ``basic.get`` and
  ``queue.purge`` are not supported;
- server-side offset tracking, LavinMQ's way: a consumer with a tag and
  ``x-stream-automatic-offset-tracking=true`` (or ``x-stream-offset`` null, which starts from
  ``first`` the first time) has its position stored durably as it acks, and resumes there when it
  consumes again under the same tag;
- retention per whole segment (``x-max-length-bytes``, ``x-max-age``), checked after appends and
  every ``RETENTION_CHECK_SECONDS`` on Trio's clock;
- ``parse_interval``: RabbitMQ's interval strings (``7D``, ``12h``; units Y M D h m s).
"""

from __future__ import annotations

import datetime
import logging
import math
import re
from typing import Final

import trio

from .. import clock
from ..backends.log.stream import LogStream
from ..model import Message
from ..protocol.codec import FieldTable, FieldValue, Long
from ..protocol.errors import AMQPError, ReplyCode
from .consumer import Consumer
from .flusher import Flusher
from .queue import Durability, NeedsFlush, Queue

log = logging.getLogger("tqbroker.stream")

RETENTION_CHECK_SECONDS: Final = 60.0
_INTERVAL: Final = re.compile(r"([0-9]+)([YMDhms])")
_UNIT_SECONDS: Final = {
    "Y": 365 * 86400,
    "M": 30 * 86400,
    "D": 86400,
    "h": 3600,
    "m": 60,
    "s": 1,
}


def parse_interval(value: str) -> int | None:
    """Milliseconds in a RabbitMQ interval string (``"7D"``, ``"1h"``), or None if invalid."""
    match = _INTERVAL.fullmatch(value)
    if match is None:
        return None
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)] * 1000


class StreamQueue(Queue):
    def __init__(
        self,
        vhost: str,
        name: str,
        stream: LogStream,
        *,
        arguments: FieldTable,
        flusher: Flusher | None,
    ) -> None:
        super().__init__(
            vhost,
            name,
            durable=True,
            exclusive_owner=None,
            auto_delete=False,
            arguments=arguments,
            flusher=flusher,
        )
        self.stream = stream
        self.backend_name = "log"
        max_bytes = arguments.get("x-max-length-bytes")
        self.max_bytes = max_bytes if isinstance(max_bytes, int) else None
        max_age = arguments.get("x-max-age")
        self.max_age_ms = parse_interval(max_age) if isinstance(max_age, str) else None
        self._positions: dict[Consumer, int] = {}  # the next offset each consumer reads
        self._tracked: set[Consumer] = set()  # consumers whose position the stream stores

    # -- the actor ---------------------------------------------------------------------------

    async def run(self) -> None:
        with self._cancel_scope:
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
                self._dispatch()

    def _apply_retention(self) -> None:
        if self.max_bytes is not None or self.max_age_ms is not None:
            removed = self.stream.apply_retention(
                max_bytes=self.max_bytes, max_age_ms=self.max_age_ms, now_ms=clock.now_ms()
            )
            if removed and self.flusher is not None:
                self.flusher.poke()  # the flush deletes the segments

    def _dispatch(self) -> None:
        stream = self.stream
        end = stream.next_offset
        for consumer in self.consumers:
            position = max(self._positions[consumer], stream.first_offset)
            while position < end and consumer.has_capacity():
                try:
                    record = stream.read(position)
                except OSError as exc:  # storage trouble: try again on the next wake-up
                    log.error("stream %r in vhost %r: cannot read: %s", self.name, self.vhost, exc)
                    break
                position += 1
                if record is None:  # damaged (logged by the log): step over it
                    continue
                consumer.unacked += 1
                message = record.message
                headers = message.properties.headers or {}
                # Every delivery says where it is, as a long, as RabbitMQ sends it.
                message = message.with_headers({**headers, "x-stream-offset": Long(record.offset)})
                consumer.channel.deliver(consumer, record.offset, message, False)
            self._positions[consumer] = position

    # -- messages ----------------------------------------------------------------------------

    def publish(self, message: Message) -> Durability:
        """Append; the confirm waits for the backend's next flush (fsync'd per its policy)."""
        self.stream.append(message)  # OSError: the caller refuses the publish
        if self.consumers or self.max_bytes is not None:
            self._wakeup.set()
        flusher = self.flusher
        if flusher is None:
            return None
        return flusher, flusher.request()

    def get(self) -> tuple[int, Message, bool] | NeedsFlush | None:
        raise AMQPError(
            ReplyCode.NOT_IMPLEMENTED,
            f"basic.get not supported by stream queues {self._describe()}",
        )

    def ack(self, message_id: int, consumer: Consumer | None) -> None:
        """An ack is credit: the consumer may receive one more message; a tracked consumer's
        stored position moves past the message."""
        if consumer is not None:
            if consumer in self._tracked:
                stored = self.stream.offsets.get(consumer.tag, 0)
                self.stream.store_offset(consumer.tag, max(stored, message_id + 1))
            self.requeue(message_id, consumer)

    def requeue(self, message_id: int, consumer: Consumer | None) -> None:
        """A stream never takes a message back or drops it: nack, reject and requeue only give
        the credit back."""
        if consumer is not None:
            consumer.unacked -= 1
            self._wakeup.set()
            if not consumer.unacked and consumer not in self._positions:
                self._tracked.discard(consumer)  # cancelled, and its last delivery settled

    reject = requeue

    def purge(self) -> int:
        raise AMQPError(
            ReplyCode.NOT_IMPLEMENTED, f"purge not supported by stream queues {self._describe()}"
        )

    @property
    def message_count(self) -> int:
        return self.stream.next_offset - self.stream.first_offset

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
                f"consumer prefetch count is not set for stream {self._describe()}",
            )
        tracking = arguments.get("x-stream-automatic-offset-tracking")
        if tracking is not None and not isinstance(tracking, bool):
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg 'x-stream-automatic-offset-tracking' for consumer on stream "
                f"{self._describe()}: a boolean is required (got {tracking!r})",
            )
        if _tracks_offset(arguments) and not tag:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"offset tracking on stream {self._describe()} needs a consumer tag",
            )
        self._start_offset(arguments.get("x-stream-offset", "next"))

    def add_consumer(self, consumer: Consumer) -> None:
        start = self._start_offset(consumer.arguments.get("x-stream-offset", "next"))
        if _tracks_offset(consumer.arguments):
            self._tracked.add(consumer)
            stored = self.stream.offsets.get(consumer.tag)
            if stored is not None:  # it consumed before: go on after its last ack
                start = min(max(stored, self.stream.first_offset), self.stream.next_offset)
        self._positions[consumer] = start
        super().add_consumer(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        self._positions.pop(consumer, None)
        if not consumer.unacked:  # else acks still to come move its stored position
            self._tracked.discard(consumer)
        super().remove_consumer(consumer)

    def _start_offset(self, spec: FieldValue) -> int:
        """Where a consumer starts, from its ``x-stream-offset`` argument, clamped to the
        stream's first and next offsets."""
        stream = self.stream
        first, end = stream.first_offset, stream.next_offset
        if spec == "first" or spec is None:  # None: offset tracking, first time from the start
            return first
        if spec == "last":  # the last message written (RabbitMQ: the last chunk)
            return max(first, end - 1)
        if spec == "next":
            return end
        if isinstance(spec, int) and not isinstance(spec, bool):
            return min(max(spec, first), end)
        if isinstance(spec, datetime.datetime):
            return stream.offset_for_timestamp(int(spec.timestamp() * 1000))
        if isinstance(spec, str) and (interval := parse_interval(spec)) is not None:
            return stream.offset_for_timestamp(clock.now_ms() - interval)
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"invalid arg 'x-stream-offset' for consumer on stream {self._describe()}: first, "
            f"last, next, an offset, a timestamp or an interval such as 1h (got {spec!r})",
        )

    def _describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost}'"


def _tracks_offset(arguments: FieldTable) -> bool:
    """Server-side offset tracking asked for: ``x-stream-automatic-offset-tracking=true`` or an
    explicit null ``x-stream-offset`` (LavinMQ's two ways)."""
    return arguments.get("x-stream-automatic-offset-tracking") is True or (
        "x-stream-offset" in arguments and arguments["x-stream-offset"] is None
    )
