"""What a connection sends, and when: the write half of ``AMQPConnection``.

Responsibilities:
- ``out``: one buffer the connection and its channels append frames to (deliveries are encoded
  straight into it); the writer task sends what it holds in one ``send_all`` until it is empty,
  so a burst of frames costs one system call;
- ``send_or_wake``: a delivery that finds the writer idle is sent at once by the task that made
  it (one non-blocking ``send``) rather than by the writer task once the scheduler gets to it,
  unless anything was sent less than ``DIRECT_SEND_GAP_NS`` before (a busy connection: the
  writer task batches); on a TLS stream, or whatever the kernel did not take, the writer task
  sends;
- back-pressure both ways: ``can_write`` is False while ``WRITE_HIGH_WATER`` bytes wait for a
  slow client (queue actors stop delivering; ``on_unblocked`` lets them go on once it drained),
  and ``wait_drained`` holds the reader meanwhile, so TCP pushes back on a client that does
  not read what it is sent;
- heartbeats: a heartbeat frame whenever nothing was sent for an interval;
- the send counters of the connection's statistics.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import trio

from ..backends.base import Popped
from ..broker.consumer import EncodedDelivery
from ..broker.stats import ConnectionStats
from ..model import Message
from ..protocol.frames import HEARTBEAT_FRAME
from .encoding import write_deliver, write_delivers, write_encoded_delivers
from .latency_trace import TRACE

log = logging.getLogger(__name__)

# Deliveries pause while this much is waiting to be written to a slow client.
WRITE_HIGH_WATER = 4 * 1024 * 1024
# For this long after any send, deliveries go through the writer task (``send_or_wake``), so that
# a burst (a queue actor's pass delivering a prefetch window) or a steady stream costs one
# system call per writer round, not one per delivery: only a connection idle for longer sends
# a delivery directly.
DIRECT_SEND_GAP_NS = 200_000
# Before the first send: earlier than any clock reading minus any gap.
NEVER_SENT_NS = -(2**63)


class ConnectionWriter:
    """The writer task of one connection (``run``) and the buffer it sends (``out``)."""

    def __init__(
        self,
        stream: trio.abc.SendStream,
        stats: ConnectionStats,
        peer: str,
        on_unblocked: Callable[[], None],
    ) -> None:
        self.stream = stream
        # Plain TCP: the socket, which ``send_or_wake`` may write to directly.
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._sending = False  # the writer task is in ``send_all``
        # When something was last sent (perf_counter_ns); at first long ago, whatever the
        # clock reads (perf_counter starts near 0 on a host up for less than the gap).
        self._sent_ns = NEVER_SENT_NS
        self.out = bytearray()
        self.done = trio.Event()  # the writer task ended
        self._stats = stats
        self._peer = peer
        self._on_unblocked = on_unblocked
        self._wakeup = trio.Event()
        self._drained = trio.Event()  # set whenever everything queued has been sent
        self._finishing = False
        self._backed_up = False
        self._sent_at = trio.current_time()
        self.traced: list[int] = []  # latency_trace slots of the deliveries in ``out``

    def write(self, data: bytes) -> None:
        self.out += data
        self._wakeup.set()

    def wake(self) -> None:
        """Something was appended to ``out`` directly: send it."""
        self._wakeup.set()

    def send_or_wake(self) -> None:
        """Something was appended to an empty ``out``: send it now, from this task, if the
        writer task is not sending and nothing was sent in the last ``DIRECT_SEND_GAP_NS``;
        else (or for what the socket did not take) wake the writer."""
        if self._fd >= 0 and not self._sending:
            now = time.perf_counter_ns()
            if now - self._sent_ns >= DIRECT_SEND_GAP_NS:
                self._sent_ns = now
                out = self.out
                try:
                    sent = os.write(self._fd, out)
                except OSError:  # full (BlockingIOError) or broken: the writer task finds out
                    sent = 0
                if sent:
                    stats = self._stats
                    stats.send_oct += sent
                    stats.send_cnt += 1
                    self._sent_at = trio.current_time()
                    if sent == len(out):
                        out.clear()
                        if TRACE is not None:
                            traced, self.traced = self.traced, []
                            TRACE.sent(traced, now)
                        return
                    del out[:sent]
        self._wakeup.set()

    def deliver(
        self,
        channel: int,
        consumer_tag: bytes,
        delivery_tag: int,
        redelivered: bool,
        message: Message,
        frame_max: int,
    ) -> None:
        """Append a ``basic.deliver`` with its content. The writer, once woken, sends what
        ``out`` holds until it is empty (every append to it wakes the writer): only the
        delivery that finds it empty needs to wake it, once per send rather than once per
        delivery; that one may go out at once, from this task (``send_or_wake``: a scheduling
        hop less for a lone delivery)."""
        idle = not self.out
        write_deliver(
            self.out, message, channel, consumer_tag, delivery_tag, redelivered, frame_max
        )
        if TRACE is not None:
            self.traced.append(TRACE.encoded(message.body))
        if idle:
            self.send_or_wake()

    def deliver_many(
        self,
        channel: int,
        consumer_tag: bytes,
        first_tag: int,
        entries: list[Popped],
        frame_max: int,
    ) -> int:
        """``deliver`` for a batch (tags from ``first_tag``); how many were redelivered. A
        lone delivery that finds the connection idle may go out at once, as ``deliver``'s does
        (a classic queue's pass at a low rate delivers one message at a time); a bigger batch
        goes through the writer task, which gathers the passes of a scheduling round."""
        idle = not self.out
        redelivered = write_delivers(self.out, channel, consumer_tag, first_tag, entries, frame_max)
        if TRACE is not None:
            self.traced.extend(TRACE.encoded(message.body) for _, message, _ in entries)
        if idle:
            if len(entries) == 1:
                self.send_or_wake()
            else:
                self.wake()
        return redelivered

    def deliver_encoded(
        self,
        channel: int,
        consumer_tag: bytes,
        first_tag: int,
        entries: list[EncodedDelivery],
        frame_max: int,
    ) -> None:
        """``deliver_many`` of messages given as their encoded parts (a stream's); a batch
        that finds the connection idle may go out at once, as ``deliver``'s lone delivery does
        (a stream consumer at a low rate gets each record without a hop to the writer)."""
        idle = not self.out
        write_encoded_delivers(self.out, channel, consumer_tag, first_tag, entries, frame_max)
        if TRACE is not None:
            self.traced.extend(TRACE.encoded(entry[3]) for entry in entries)
        if idle:
            self.send_or_wake()

    def clear(self) -> None:
        """Drop what was not sent yet (the connection is being dropped)."""
        self.out.clear()

    def can_write(self) -> bool:
        """False while the client is slow to read what we already queued for it."""
        if len(self.out) < WRITE_HIGH_WATER:
            return True
        self._backed_up = True
        return False

    async def wait_drained(self) -> None:
        """Return once the client has read enough of what we queued for it (at once if it
        has)."""
        if len(self.out) >= WRITE_HIGH_WATER:
            self._drained = trio.Event()
            await self._drained.wait()

    async def finish(self) -> None:
        """Send what is queued (a ``connection.close``, say), then end the writer task (the
        caller bounds the wait)."""
        self._finishing = True
        self._wakeup.set()
        await self.done.wait()

    async def run(self) -> None:
        """The writer task: send whatever ``out`` holds whenever it is woken."""
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                stats = self._stats
                while self.out:
                    data, self.out = self.out, bytearray()
                    stats.send_oct += len(data)
                    stats.send_cnt += 1
                    self._sending = True
                    if TRACE is None:
                        await self.stream.send_all(data)
                    else:
                        traced, self.traced = self.traced, []
                        started = time.perf_counter_ns()
                        await self.stream.send_all(data)
                        TRACE.sent(traced, started)
                    self._sending = False
                    self._sent_ns = time.perf_counter_ns()
                    self._sent_at = trio.current_time()
                self._drained.set()
                if self._backed_up:
                    self._backed_up = False
                    self._on_unblocked()
                if self._finishing:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("connection %s: write failed: %r", self._peer, exc)
            self.out.clear()
        finally:
            self._fd = -1  # the socket closes next: its number may be reused
            self.done.set()

    async def heartbeats(self, interval: float) -> None:
        """Send a heartbeat frame whenever nothing else went out for ``interval`` seconds."""
        self._sent_at = trio.current_time()
        while True:
            # Sleep until ``interval`` after the last frame went out, not on a fixed tick: a
            # tick just after a write would skip a beat and halve the rate the peer sees.
            quiet_until = self._sent_at + interval
            if trio.current_time() < quiet_until:
                await trio.sleep_until(quiet_until)
                continue
            self.write(HEARTBEAT_FRAME)
            self._sent_at = trio.current_time()
