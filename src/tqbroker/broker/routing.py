"""Routing a message through a vhost's exchanges, and handing it to where it goes.

Responsibilities:
- ``Routing.route``: the destinations of a routing key through exchange-to-exchange bindings
  and alternate exchanges (a plain function call, no task);
- the route memo: where a routing key goes from an exchange, kept while every exchange on the way
  is ``cacheable`` (its router promises a result that depends only on the routing key and the
  bindings: direct, fanout, topic; not headers, holding or per-call routers), forgotten as a whole
  whenever routing state changes (``changed``: a binding, an exchange or a queue comes or goes),
  and at most ``ROUTE_MEMO_SIZE`` entries;
- ``Routing.enqueue``: hand a routed message to each destination, collecting what a publisher
  confirm waits for and whether a destination refused it; ``enqueue_run`` for a run of messages
  routed alike (``memoised`` says when a route holds for all of them).

Both are on the publish path: no allocation or call here that the path does not need.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Final, cast

from ..model import Message
from ..plugins.spec import Destination, GroupCommit
from ..protocol.methods import BasicProperties
from .exchange import DefaultExchange, Exchange
from .queue import Queue, QueueFull

log = logging.getLogger(__name__)

# The most (exchange, routing key) routes a vhost memoises; it forgets them all past that, so that
# random routing keys cannot grow it without limit.
ROUTE_MEMO_SIZE: Final = 10_000


class Routing:
    """Routes over one vhost's exchanges and queues (the vhost's own dicts, read live)."""

    def __init__(
        self,
        exchanges: Mapping[str, Exchange],
        queues: Mapping[str, Queue],
        default_exchange: DefaultExchange,
    ) -> None:
        self._exchanges = exchanges
        self._queues = queues
        self._default_exchange = default_exchange
        # (exchange, routing key) -> where ``route`` sends it, for cacheable routes only: tuples,
        # shared by every caller (never mutated). Cleared by ``changed``.
        self.memo: dict[tuple[Exchange, str], tuple[Destination, ...]] = {}

    def changed(self) -> None:
        """Forget every memoised route: a binding, an exchange or a queue came or went (called
        by every change of routing state, before anything routes again)."""
        if self.memo:
            self.memo.clear()

    def route_keys(
        self, exchange: Exchange, keys: Sequence[str], properties: BasicProperties
    ) -> Sequence[Destination]:
        """``route`` for each of ``keys`` (a routing key and its CC/BCC keys), each
        destination once. The result may be a memoised tuple shared with later calls: read it,
        never mutate it."""
        if len(keys) == 1:
            return self.route(exchange, keys[0], properties)
        found: dict[int, Destination] = {}
        for key in keys:
            for destination in self.route(exchange, key, properties):
                found[id(destination)] = destination
        return tuple(found.values())

    def route(
        self, exchange: Exchange, routing_key: str, properties: BasicProperties
    ) -> tuple[Destination, ...]:
        """The queues a message reaches, each once, following exchange-to-exchange bindings and
        alternate exchanges; and the ``Destination`` objects of exchange types that hold
        messages (``plugins.spec``), which take the message to route it later.

        Memoised per (exchange, routing key) when every exchange whose router was asked is
        ``cacheable`` (then the properties played no part), until ``changed``."""
        if exchange is self._default_exchange:
            queue = self._queues.get(routing_key)
            return (queue,) if queue is not None else ()
        memo = self.memo
        if exchange.cacheable:
            memoised = memo.get((exchange, routing_key))
            if memoised is not None:
                return memoised
        cacheable = True
        queues: dict[int, Destination] = {}
        seen: set[Hashable] = {exchange}
        frontier = [exchange]
        while frontier:
            current = frontier.pop()
            if not current.cacheable:
                cacheable = False
            routed = False
            for dest in current.route(routing_key, properties):
                routed = True
                if isinstance(dest, Queue):
                    queues[id(dest)] = dest
                elif isinstance(dest, Exchange):
                    if dest not in seen:
                        seen.add(dest)
                        frontier.append(dest)
                else:  # an exchange type's own destination
                    queues[id(dest)] = cast(Destination, dest)
            if not routed and current.alternate is not None:
                alternate = self._exchanges.get(current.alternate)
                if alternate is not None and alternate not in seen:
                    seen.add(alternate)
                    frontier.append(alternate)
        found = tuple(queues.values())
        if cacheable:
            if len(memo) >= ROUTE_MEMO_SIZE:
                memo.clear()
            memo[(exchange, routing_key)] = found
        return found

    def memoised(self, exchange: Exchange, routing_key: str) -> tuple[Destination, ...] | None:
        """Where a message with ``routing_key`` and no headers goes from ``exchange``, when that
        is known without asking a router: the default exchange's queue, or a memoised route
        (then it holds for every such message until ``changed``); else None."""
        if exchange is self._default_exchange:
            queue = self._queues.get(routing_key)
            return (queue,) if queue is not None else ()
        return self.memo.get((exchange, routing_key))

    @staticmethod
    def enqueue(
        destinations: Iterable[Destination], message: Message
    ) -> tuple[list[tuple[GroupCommit, int]], bool]:
        """Hand a routed message to each destination; return the flusher tickets a publisher
        confirm waits for, and whether a destination refused it (full with reject-publish, or
        its storage cannot write: the publish is nacked; the others keep it)."""
        waits: list[tuple[GroupCommit, int]] = []
        refused = False
        for destination in destinations:
            if not destination.accepting:
                refused = True
                continue
            try:
                durability = destination.publish(message)
            except Exception as exc:
                _refused(destination, exc)
                refused = True
                continue
            if durability is not None:
                waits.append(durability)
        return waits, refused

    @staticmethod
    def enqueue_run(
        queues: Sequence[Queue], messages: Sequence[Message]
    ) -> tuple[list[tuple[GroupCommit, int]], list[bool] | None]:
        """``enqueue`` for messages routed alike, each queue taking them as a run
        (``Queue.publish_run``): the flusher tickets that every confirm of the run waits for
        (no flush completes while the run is enqueued, so waiting for the last of a queue's
        tickets costs the earlier messages nothing), and which messages a queue refused (None:
        none)."""
        waits: list[tuple[GroupCommit, int]] = []
        refused: list[bool] | None = None
        count = len(messages)
        for queue in queues:
            start = 0
            while start < count:
                if not queue.accepting:
                    if refused is None:
                        refused = [False] * count
                    refused[start:] = [True] * (count - start)
                    break
                taken, durability, error = queue.publish_run(
                    messages[start:] if start else messages
                )
                if durability is not None:
                    waits.append(durability)
                start += taken
                if error is None:
                    break
                _refused(queue, error)
                if refused is None:
                    refused = [False] * count
                refused[start] = True
                start += 1
        return waits, refused


def _refused(destination: Destination, error: Exception) -> None:
    """What ``destination.publish`` raised: a full queue or its storage refusing are the
    publisher's answer (a nack); anything else is a bug, and the queue fails (its consumers
    are cancelled, the rest of the broker goes on)."""
    if isinstance(error, QueueFull):
        return
    if isinstance(error, OSError):
        log.error("queue %r refused a message: %s", destination.name, error)
    elif isinstance(destination, Queue):
        destination.fail(error)
    else:
        log.error("destination %r failed to take a message", destination.name, exc_info=error)
