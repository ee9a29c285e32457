"""Kafka's idempotent producer, per partition: each batch of a producer id carries its epoch
and the sequence of its first record; the partition appends a batch only when its sequence
follows the last one it took from that producer (Kafka's ``ProducerAppendInfo.checkSequence``
and ``ProducerStateEntry``, ``storage/.../internals/log/``):

- a batch of an epoch below the producer's is ``InvalidProducerEpoch`` (Kafka's
  ``INVALID_PRODUCER_EPOCH``);
- in a new epoch the first sequence must be 0 (unless the partition knows no epoch of that
  producer: any sequence is taken then, as Kafka takes one after retention dropped its state);
- in the same epoch it must be one past the last (wrapping from 2**31 - 1 to 0), else
  ``OutOfOrderSequence`` (``OUT_OF_ORDER_SEQUENCE_NUMBER``);
- a batch that repeats one of the producer's last five (the same epoch, first and last
  sequence: a retry whose answer was lost) is not appended again: it is answered with the
  offset that batch got (``Duplicate``). A repeat older than those five, or from before a
  restart (the five are kept in memory), is ``DuplicateSequence`` (Kafka's
  ``DUPLICATE_SEQUENCE_NUMBER``, which clients take as written).

The epoch and the next sequence are the partition's ``ProducerState`` (durable with the records
the batch wrote, by the same flush: ``Partition.record_producer``), under the key
``kafka:<producer id>``, apart from the HTTP API's producer ids.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import attrs

from ...backends.streams import ProducerState

RETAINED_BATCHES: Final = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
MAX_SEQUENCE: Final = 2**31 - 1


class SequenceError(Exception):
    """A batch the partition refuses for its producer's state."""


class InvalidProducerEpoch(SequenceError):
    pass


class OutOfOrderSequence(SequenceError):
    pass


class DuplicateSequence(SequenceError):
    pass


@attrs.frozen
class Duplicate:
    """The batch was appended before, at ``offset`` (its last record at ``last_offset``)."""

    offset: int
    last_offset: int


@attrs.frozen
class _Appended:
    epoch: int
    first_sequence: int
    last_sequence: int
    offset: int
    last_offset: int


def state_key(producer_id: int) -> str:
    return f"kafka:{producer_id}"


class RecentBatches:
    """A partition's last few batches of each Kafka producer id, in memory."""

    def __init__(self) -> None:
        self._batches: dict[int, deque[_Appended]] = {}

    def check(
        self, state: ProducerState | None, producer_id: int, epoch: int, first: int, count: int
    ) -> Duplicate | None:
        """None when the batch is to be appended; ``Duplicate`` when it was; else raises a
        ``SequenceError``."""
        last = _last_sequence(first, count)
        if state is not None and epoch < state.epoch:
            raise InvalidProducerEpoch(f"epoch {epoch} is below the producer's {state.epoch}")
        if state is None or epoch > state.epoch:
            if first != 0 and state is not None:
                raise OutOfOrderSequence(f"a new epoch {epoch} begins at sequence {first}, not 0")
            return None
        for batch in self._batches.get(producer_id, ()):
            if (batch.epoch, batch.first_sequence, batch.last_sequence) == (epoch, first, last):
                return Duplicate(batch.offset, batch.last_offset)
        expected = state.next_sequence
        if first == expected:
            return None
        if _before(first, expected):
            raise DuplicateSequence(f"sequence {first} was written (next is {expected})")
        raise OutOfOrderSequence(f"sequence {first} where {expected} belongs")

    def appended(
        self, producer_id: int, epoch: int, first: int, count: int, offset: int
    ) -> ProducerState:
        """Remember an appended batch; the producer's state after it."""
        batches = self._batches.setdefault(producer_id, deque(maxlen=RETAINED_BATCHES))
        last = _last_sequence(first, count)
        batches.append(_Appended(epoch, first, last, offset, offset + count - 1))
        return ProducerState(epoch, 0 if last == MAX_SEQUENCE else last + 1)


def _last_sequence(first: int, count: int) -> int:
    last = first + count - 1
    return last if last <= MAX_SEQUENCE else last - MAX_SEQUENCE - 1


def _before(sequence: int, expected: int) -> bool:
    """Whether ``sequence`` lies before ``expected`` (within half the sequence space)."""
    return 0 < (expected - sequence) % (MAX_SEQUENCE + 1) < (MAX_SEQUENCE + 1) // 2
