"""Publisher confirms of one channel (``confirm.select``).

Responsibilities:
- number the channel's publishes and remember those that wait for a flush (persistent messages
  on durable queues) or that a queue refused (its storage cannot write): consecutive publishes
  that wait for the same flushes (a stream's record batch has one ticket) as one run;
- confirm them in order with as few ``basic.ack(multiple=True)`` as possible (the connection
  calls ``flush`` once per read batch), ``basic.nack`` those refused or whose flush failed;
  count the acked ones (the channel's ``confirm`` counter);
- be the flushers' listener for the publishes that wait on them (``FlushListener``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import attrs

from ..broker.stats import MessageStats
from ..plugins.spec import GroupCommit
from ..protocol.methods import BasicAck, BasicNack, Method

log = logging.getLogger(__name__)

# A flush a publish (or a commit) waits for: the flusher and the ticket it handed out.
Wait = tuple[GroupCommit, int]


@attrs.define(eq=False)
class _Pending:
    """Publishes ``first`` to ``seq`` that wait for the same flushes, or one that was refused
    (then nacked)."""

    first: int
    seq: int
    waits: list[Wait]
    failed: bool


class PublisherConfirms:
    def __init__(
        self,
        send: Callable[[Method], None],
        internal_error: Callable[[Exception, str], None],
        stats: MessageStats,
    ) -> None:
        self._send = send
        self._stats = stats  # the channel's: ``confirm`` counts the publishes acked
        self._internal_error = internal_error
        self.publish_seq = 0
        self.confirmed = 0  # every publish up to this one has been acked or nacked
        self._pending: deque[_Pending] = deque()

    def published(self, waits: list[Wait], refused: bool, count: int = 1) -> None:
        """``count`` more publishes in a row, routed: what their confirms wait for, and whether
        a queue refused them."""
        first = self.publish_seq + 1
        self.publish_seq = seq = self.publish_seq + count
        if waits or refused:
            pending = self._pending
            if pending and not refused:
                last = pending[-1]
                if last.seq == first - 1 and not last.failed and last.waits == waits:
                    last.seq = seq  # the same flushes: one run
                    return
            pending.append(_Pending(first, seq, waits, refused))
            for flusher, _ticket in waits:
                flusher.listen(self)

    def flush(self) -> None:
        """Confirm every publish that is durable where it needs to be; nack those whose storage
        failed. Publishes are settled in order: nothing is acked past one that still waits for
        a flush."""
        pending = self._pending
        while pending:
            head = pending[0]
            if head.failed:
                self._ack_upto(head.first - 1)
                self._send(BasicNack(head.seq, head.seq > head.first, False))
                self.confirmed = head.seq
            elif not all(flusher.completed >= ticket for flusher, ticket in head.waits):
                break
            pending.popleft()
        self._ack_upto(pending[0].first - 1 if pending else self.publish_seq)

    def _ack_upto(self, seq: int) -> None:
        if seq > self.confirmed:
            self._send(BasicAck(seq, seq - self.confirmed > 1))
            self._stats.confirm += seq - self.confirmed
            self.confirmed = seq

    def close(self) -> None:
        for pending in self._pending:
            for flusher, _ticket in pending.waits:
                flusher.unlisten(self)
        self._pending.clear()

    # -- FlushListener (called by flushers) --------------------------------------------------

    def flushed(self, flusher: GroupCommit) -> None:
        try:
            if self._pending:
                self.flush()
        except Exception as exc:  # a bug: its connection closes, not the flusher
            self._internal_error(exc, "publisher confirms")
        if not self._pending:
            flusher.unlisten(self)

    def flush_failed(self, flusher: GroupCommit, upto: int) -> None:
        try:
            for pending in self._pending:
                if any(f is flusher and flusher.completed < t <= upto for f, t in pending.waits):
                    pending.failed = True
            self.flush()
        except Exception as exc:  # a bug: its connection closes, not the flusher
            self._internal_error(exc, "publisher confirms")
