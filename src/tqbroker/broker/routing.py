"""Publishing a message to an exchange, as the broker does it for every caller: routing it
through a vhost's exchanges, and handing it to where it goes.

Responsibilities:
- ``Routing.publish``: what one publish does, whoever publishes (an AMQP ``basic.publish``, the
  management API's publish, an HTTP produce, a dead-lettered copy, a held message leaving its
  exchange): a reply to a direct reply-to address, sender-selected distribution (``CC`` and
  ``BCC`` headers; ``BCC`` removed before delivery), the exchange's routing, enqueueing, and what
  came of it (``Routed``: what a confirm waits for, whether a destination refused it, the message
  to return when it was ``mandatory`` and reached no queue, where it went); the exchange's and
  the publisher's counters of it (``broker/stats.py``);
- ``Routing.publish_run``: the messages of one run of publishes (an AMQP method repeated), routed
  once and enqueued together where the route holds for all of them, else one by one;
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

All of it is on the publish path: no allocation or call here that the path does not need.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from itertools import groupby
from typing import Final, cast

from ..model import Message
from ..plugins.spec import Destination, Durability, GroupCommit
from ..protocol.methods import HEADERS_FLAG, BasicProperties
from .exchange import DefaultExchange, Exchange
from .queue import Queue, QueueFull
from .reply_to import REPLY_TO_PREFIX
from .stats import MessageStats

log = logging.getLogger(__name__)

# The most (exchange, routing key) routes a vhost memoises; it forgets them all past that, so that
# random routing keys cannot grow it without limit.
ROUTE_MEMO_SIZE: Final = 10_000
# What the confirms of some publishes in a row wait for: how many, the flusher tickets, refused.
ConfirmRun = tuple[int, list[tuple[GroupCommit, int]], bool]
# What one publish did (``Routing.publish``): the flusher tickets its confirm waits for; whether a
# destination refused it (full with reject-publish, or its storage cannot write: a nack); the
# message to return (``basic.return``) when it was mandatory and reached no queue, else None; the
# destinations it was handed to (maybe a memoised tuple: read it, never mutate it). A tuple: this
# is every publish's path.
Routed = tuple[list[tuple[GroupCommit, int]], bool, Message | None, Sequence[Destination]]
# Whether a routed destination takes the message (``Routing.publish``'s ``to``).
Takes = Callable[[Destination], bool]

# The headers property's bit in the first byte of the property flags.
_HEADERS_FLAG_HIGH: Final = HEADERS_FLAG >> 8
# What the default exchange is routed with (it reads only the routing key).
_NO_PROPERTIES: Final = BasicProperties()


class Routing:
    """Routes over one vhost's exchanges and queues (the vhost's own dicts, read live)."""

    def __init__(
        self,
        exchanges: Mapping[str, Exchange],
        queues: Mapping[str, Queue],
        default_exchange: DefaultExchange,
        deliver_reply: Callable[[str, Message], bool],
    ) -> None:
        self._exchanges = exchanges
        self._queues = queues
        self._default_exchange = default_exchange
        # Delivers a reply published to a direct reply-to address (``reply_to.ReplyTo.deliver``).
        self._deliver_reply = deliver_reply
        # (exchange, routing key) -> where ``route`` sends it, for cacheable routes only: tuples,
        # shared by every caller (never mutated). Cleared by ``changed``.
        self.memo: dict[tuple[Exchange, str], tuple[Destination, ...]] = {}

    def changed(self) -> None:
        """Forget every memoised route: a binding, an exchange or a queue came or went (called
        by every change of routing state, before anything routes again)."""
        if self.memo:
            self.memo.clear()

    def publish(
        self,
        exchange: Exchange,
        message: Message,
        mandatory: bool = False,
        stats: MessageStats | None = None,
        to: Takes | None = None,
        sender_selected: bool = True,
    ) -> Routed:
        """Publish ``message`` to ``exchange``: route it on its routing key and its ``CC`` and
        ``BCC`` keys (``BCC`` removed from what is delivered: RabbitMQ's sender-selected
        distribution; not with ``sender_selected=False``, for a record whose headers are its
        own), following exchange-to-exchange bindings and alternate exchanges, and hand it to
        the destinations found (those ``to`` takes, if given: dead-lettering skips cycles, a
        topic's produce takes its partitions).

        ``stats``: the counters of the client that publishes (its channel's, or the HTTP API's):
        the message counts in the exchange's ``publish_in`` (and ``publish_out`` once per
        destination) and, when it reached no queue, in the client's ``return_unroutable``
        (``mandatory``) or ``drop_unroutable``; a direct reply-to address on the default
        exchange delivers the reply. None when the broker republishes a message
        (dead-lettering, a held message leaving): RabbitMQ neither counts those nor routes
        them to reply addresses. A destination that holds the message to route it later
        (x-delayed-message) is not a route yet: a mandatory message reaching only such is
        returned, as in RabbitMQ.

        The hot path calls this positionally."""
        default, exchange_stats = self._default_exchange, exchange.stats
        if stats is not None:
            exchange_stats.publish_in += 1
            if exchange is default and message.routing_key.startswith(REPLY_TO_PREFIX):
                if self._deliver_reply(message.routing_key, message):
                    exchange_stats.publish_out += 1
                    return [], False, None, ()
                if mandatory:  # as below: returned, or dropped
                    stats.return_unroutable += 1
                    return [], False, message, ()
                stats.drop_unroutable += 1
                return [], False, None, ()
        destinations: Sequence[Destination]
        if message.properties_raw[0] & _HEADERS_FLAG_HIGH and sender_selected:
            headers = message.properties.headers
            destinations = self.route_keys(
                exchange, message.routing_keys(bcc=True), message.properties
            )
            if headers and "BCC" in headers:
                message = message.with_headers({k: v for k, v in headers.items() if k != "BCC"})
        else:
            # No CC or BCC keys. The default exchange routes by the routing key alone, so
            # properties a publish left undecoded stay so.
            destinations = self.route(
                exchange,
                message.routing_key,
                _NO_PROPERTIES if exchange is default else message.properties,
            )
        if to is not None:
            destinations = tuple(filter(to, destinations))
        waits, refused = self.enqueue(destinations, message)
        if stats is None:
            return waits, refused, None, destinations
        if destinations:
            exchange_stats.publish_out += len(destinations)
            if not mandatory or any(isinstance(d, Queue) for d in destinations):
                return waits, refused, None, destinations
        # It reached no queue: returned if mandatory, else dropped.
        if mandatory:
            stats.return_unroutable += 1
            return waits, refused, message, destinations
        stats.drop_unroutable += 1
        return waits, refused, None, destinations

    def publish_run(
        self,
        exchange: Exchange,
        messages: Sequence[Message],
        mandatory: bool,
        stats: MessageStats,
        write_return: Callable[[Message], None],
    ) -> list[ConfirmRun]:
        """``publish`` for the messages of a run of publishes by a client (one method: the
        same exchange, routing key and mandatory flag), in order: what their confirms wait
        for, as runs; a message to return is handed to ``write_return`` at once (before what
        routing the next one delivers). The first is published alone; when its route is known
        to hold for the others (``memoised``: no router is asked) and none has headers (no CC
        or BCC keys), they go there together (``enqueue_run``), else one by one."""
        first = messages[0]
        waits, refused, returned, _ = self.publish(exchange, first, mandatory, stats)
        confirms: list[ConfirmRun] = [(1, waits, refused)]
        if returned is not None:
            write_return(returned)
        rest = messages[1:]
        if not rest:
            return confirms
        routing_key = first.routing_key
        queues = (
            None
            if exchange is self._default_exchange and routing_key.startswith(REPLY_TO_PREFIX)
            else self.memoised(exchange, routing_key)
        )
        if (
            not queues
            or not all(isinstance(queue, Queue) for queue in queues)
            or any(message.properties_raw[0] & _HEADERS_FLAG_HIGH for message in rest)
        ):
            publish = self.publish
            for message in rest:
                waits, refused, returned, _ = publish(exchange, message, mandatory, stats)
                confirms.append((1, waits, refused))
                if returned is not None:
                    write_return(returned)
            return confirms
        exchange_stats = exchange.stats
        exchange_stats.publish_in += len(rest)
        exchange_stats.publish_out += len(rest) * len(queues)
        return confirms + self.enqueue_run(cast(tuple[Queue, ...], queues), rest)

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
