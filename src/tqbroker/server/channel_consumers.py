"""A channel's consumers (``ChannelConsumers``): by tag, for ``basic.cancel`` and a tag's reuse,
and by queue, to tell the queues it consumes from that it takes deliveries again and to let
them all go when it closes (``take_all``: a queue's consumers at most ``CONSUMERS_PER_STEP`` at
a time, without a pass over every consumer)."""

from __future__ import annotations

from collections.abc import Iterator, KeysView, ValuesView
from typing import Final

from ..broker.consumer import Consumer
from ..broker.queue import Queue

# A closing channel's consumers leave their queues at most this many at a time (a channel
# closing paced yields between two such steps).
CONSUMERS_PER_STEP: Final = 5000


class ChannelConsumers:
    """The consumers of one channel, by tag and by queue."""

    __slots__ = ("_by_queue", "_by_tag")

    def __init__(self) -> None:
        self._by_tag: dict[str, Consumer] = {}
        self._by_queue: dict[Queue, dict[str, Consumer]] = {}

    def __len__(self) -> int:
        return len(self._by_tag)

    def __contains__(self, tag: object) -> bool:
        return tag in self._by_tag

    def get(self, tag: str) -> Consumer | None:
        return self._by_tag.get(tag)

    def values(self) -> ValuesView[Consumer]:
        return self._by_tag.values()

    def queues(self) -> KeysView[Queue]:
        """The queues the channel consumes from."""
        return self._by_queue.keys()

    def add(self, consumer: Consumer) -> None:
        self._by_tag[consumer.tag] = consumer
        self._by_queue.setdefault(consumer.queue, {})[consumer.tag] = consumer

    def forget(self, consumer: Consumer) -> None:
        """``consumer`` is no longer the channel's (cancelled, or its queue went away)."""
        del self._by_tag[consumer.tag]
        of_queue = self._by_queue[consumer.queue]
        del of_queue[consumer.tag]
        if not of_queue:
            del self._by_queue[consumer.queue]

    def take_all(self) -> Iterator[tuple[Queue, list[Consumer]]]:
        """Every consumer, by queue, at most ``CONSUMERS_PER_STEP`` at a time; the channel has
        none left as soon as this is called."""
        by_queue, self._by_queue, self._by_tag = self._by_queue, {}, {}
        return _steps(by_queue)


def _steps(by_queue: dict[Queue, dict[str, Consumer]]) -> Iterator[tuple[Queue, list[Consumer]]]:
    while by_queue:
        # Popped, not iterated: the map would hold the last reference to every consumer, and
        # freeing 100k at once when it is dropped holds the loop for ~50 ms.
        queue, consumers = by_queue.popitem()
        gone = list(consumers.values())
        del consumers
        for start in range(0, len(gone), CONSUMERS_PER_STEP):
            yield queue, gone[start : start + CONSUMERS_PER_STEP]
