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
from itertools import groupby
from typing import Final, cast

from ..model import Message
from ..plugins.spec import Destination, Durability, GroupCommit
from ..protocol.methods import BasicProperties
from .exchange import DefaultExchange, Exchange
from .queue import Queue, QueueFull

log = logging.getLogger(__name__)

# The most (exchange, routing key) routes a vhost memoises; it forgets them all past that, so that
# random routing keys cannot grow it without limit.
ROUTE_MEMO_SIZE: Final = 10_000
# What the confirms of some publishes in a row wait for: how many, the flusher tickets, refused.
ConfirmRun = tuple[int, list[tuple[GroupCommit, int]], bool]


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
    def enqueue_run(queues: Sequence[Queue], messages: Sequence[Message]) -> list[ConfirmRun]:
        """``enqueue`` for messages routed alike to ``queues``: what their confirms wait for,
        as runs of publishes in order (how many, the flusher tickets, refused or not). Each
        queue takes the messages as a run (``Queue.publish_run``), unless one of several may
        dead-letter as it takes them (into another of the route, maybe): then each message
        goes to every queue before the next, as one by one."""
        if len(queues) > 1 and any(queue.dead_letters_on_publish for queue in queues):
            return [(1, *Routing.enqueue(queues, message)) for message in messages]
        runs = [_queue_run(queue, messages) for queue in queues]
        if len(runs) == 1:
            return runs[0]
        if all(len(queue_runs) == 1 for queue_runs in runs):  # each queue: all alike
            waits = [wait for ((_count, queue_waits, _refused),) in runs for wait in queue_waits]
            refused = any(queue_refused for ((_count, _waits, queue_refused),) in runs)
            return [(len(messages), waits, refused)]
        # Each message waits for what every queue's run says of it.
        each_waits: list[list[tuple[GroupCommit, int]]] = [[] for _ in messages]
        each_refused = [False] * len(messages)
        for queue_runs in runs:
            i = 0
            for count, queue_waits, queue_refused in queue_runs:
                for j in range(i, i + count):
                    each_waits[j] += queue_waits
                    each_refused[j] = each_refused[j] or queue_refused
                i += count
        return [(1, w, r) for w, r in zip(each_waits, each_refused, strict=True)]


def _queue_run(queue: Queue, messages: Sequence[Message]) -> list[ConfirmRun]:
    """One queue takes a run of messages (``Queue.publish_run``): what their confirms wait
    for, as runs. A run of messages that all wait for a flush waits for the last ticket: no
    flush completes while the run is enqueued, so the earlier messages lose nothing."""
    confirms: list[ConfirmRun] = []
    count, start = len(messages), 0
    while start < count:
        if not queue.accepting:
            confirms.append((count - start, [], True))
            break
        try:
            durabilities, error = queue.publish_run(messages[start:] if start else messages)
        except Exception as exc:  # a bug in the kind's own run: as ``enqueue`` has it
            _refused(queue, exc)
            confirms.append((count - start, [], True))
            break
        if durabilities:
            confirms += _confirm_runs(durabilities)
            start += len(durabilities)
        if error is None:
            break
        _refused(queue, error)
        confirms.append((1, [], True))
        start += 1
    return confirms


def _confirm_runs(durabilities: list[Durability]) -> list[ConfirmRun]:
    """Consecutive publishes alike (waiting for a flush or not) as one confirm run each."""
    waiting = len(durabilities) - durabilities.count(None)
    if not waiting:
        return [(len(durabilities), [], False)]
    if waiting == len(durabilities):
        last = durabilities[-1]
        assert last is not None
        return [(waiting, [last], False)]
    runs: list[ConfirmRun] = []
    for durable, group in groupby(durabilities, key=_is_durable):
        taken = list(group)
        last = taken[-1]
        runs.append((len(taken), [last] if durable and last is not None else [], False))
    return runs


def _is_durable(durability: Durability) -> bool:
    return durability is not None


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
