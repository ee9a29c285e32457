"""A transactional channel's transaction (``tx.select``).

Responsibilities:
- hold the publishes and the settlements (acks, nacks, rejects) made since the last commit or
  rollback;
- ``commit``: route the publishes, settle the deliveries; ``tx.commit-ok`` goes out once every
  persistent message of it is durable (the transaction is the flushers' ``FlushListener``
  meanwhile); a storage that refused a message or whose flush failed fails the commit (541 on
  the channel);
- ``rollback``: drop the publishes, hand back the deliveries whose settlement it undoes, and
  give the memory of many dropped publishes back to the system (``give_back_memory``: glibc
  keeps the freed bodies' heap pages otherwise; 500,000 publishes kept 521 MB).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections import deque
from collections.abc import Callable, Mapping

from ..broker.exchange import Exchange
from ..model import Message
from ..plugins.spec import GroupCommit
from ..protocol.errors import AMQPError, ReplyCode
from ..protocol.methods import Method, TxCommitOk
from .confirms import Wait
from .deliveries import Delivery, Settlement, Taken

log = logging.getLogger(__name__)

# Route and enqueue one publish (exchange, message, mandatory): what a confirm or commit must
# wait for, and whether a queue refused the message.
Route = Callable[[Exchange, Message, bool], tuple[list[Wait], bool]]


# A rollback of at least this many publishes returns the freed memory to the system.
GIVE_BACK_AFTER = 1000


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    return trim


def give_back_memory() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``; nothing
    elsewhere). The bodies of dropped messages are freed, but glibc keeps the pages they were
    on (between live allocations, the heap cannot shrink) unless asked: milliseconds."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def commit_error() -> AMQPError:
    return AMQPError(
        ReplyCode.INTERNAL_ERROR,
        "the transaction's messages could not be stored durably",
        class_id=90,
        method_id=20,
        hard=False,
    )


class Transaction:
    def __init__(
        self,
        channel: int,
        send: Callable[[Method], None],
        fail_channel: Callable[[AMQPError], None],
        internal_error: Callable[[Exception, str], None],
    ) -> None:
        self._channel = channel
        self._send = send
        self._fail_channel = fail_channel
        self._internal_error = internal_error
        self.publishes: list[tuple[Exchange, Message, bool]] = []  # (exchange, message, mandatory)
        self.settlements: list[tuple[int, Delivery, Settlement]] = []  # (tag, delivery, how)
        self._pending: deque[list[Wait]] = deque()  # commit-oks waiting for durability

    def settle(self, taken: Taken, settlement: Settlement) -> None:
        self.settlements.extend((tag, delivery, settlement) for tag, delivery in taken)

    def commit(self, route: Route, exchanges: Mapping[str, Exchange]) -> tuple[bool, bool]:
        """Route the publishes (to exchanges that still exist) and settle the deliveries; return
        whether any delivery was settled, and whether a queue refused a message (then the
        commit fails: ``commit_error``, and no commit-ok follows)."""
        publishes, self.publishes = self.publishes, []
        waits: list[Wait] = []
        refused = False
        for exchange, message, mandatory in publishes:
            if exchanges.get(exchange.name) is exchange:
                publish_waits, publish_refused = route(exchange, message, mandatory)
                waits.extend(publish_waits)
                refused = refused or publish_refused
        settlements, self.settlements = self.settlements, []
        for _tag, delivery, settlement in settlements:
            delivery.settle(settlement)
        if not refused:
            self._pending.append(waits)
            for flusher, _ticket in waits:
                flusher.listen(self)
            self._flush_commits()
        return bool(settlements), refused

    def rollback(self) -> Taken:
        """Drop the publishes; return the deliveries whose settlement is undone."""
        dropped, self.publishes = len(self.publishes), []
        if dropped >= GIVE_BACK_AFTER:
            give_back_memory()
        taken = [(tag, delivery) for tag, delivery, _settlement in self.settlements]
        self.settlements = []
        return taken

    def close(self) -> Taken:
        """The channel is gone: return the deliveries settled in the transaction (requeued)."""
        taken = self.rollback()
        for waits in self._pending:
            for flusher, _ticket in waits:
                flusher.unlisten(self)
        self._pending.clear()
        return taken

    def _flush_commits(self) -> None:
        pending = self._pending
        while pending and all(flusher.completed >= ticket for flusher, ticket in pending[0]):
            pending.popleft()
            self._send(TxCommitOk())

    # -- FlushListener (called by flushers) --------------------------------------------------

    def flushed(self, flusher: GroupCommit) -> None:
        try:
            self._flush_commits()
        except Exception as exc:  # a bug: its connection closes, not the flusher
            self._internal_error(exc, "tx.commit")
        if not self._pending:
            flusher.unlisten(self)

    def flush_failed(self, flusher: GroupCommit, upto: int) -> None:
        if any(
            f is flusher and flusher.completed < t <= upto
            for waits in self._pending
            for f, t in waits
        ):
            self._pending.clear()
            self._fail_channel(commit_error().on_method(self._channel, 90, 20))
