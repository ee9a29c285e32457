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
  confirm waits for and whether a destination refused it.

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
            except QueueFull:
                refused = True
                continue
            except OSError as exc:
                log.error("queue %r refused a message: %s", destination.name, exc)
                refused = True
                continue
            except Exception as exc:  # a bug in the queue's store or an exchange type's
                refused = True
                if isinstance(destination, Queue):
                    destination.fail(exc)
                else:
                    log.exception("destination %r failed to take a message", destination.name)
                continue
            if durability is not None:
                waits.append(durability)
        return waits, refused
