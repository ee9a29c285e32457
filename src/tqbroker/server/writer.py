"""What a connection sends, and when: the write half of ``AMQPConnection``.

Responsibilities:
- ``out``: one buffer the connection and its channels append frames to (deliveries are encoded
  straight into it); the writer task sends what it holds in one ``send_all`` until it is empty,
  so a burst of frames costs one system call;
- back-pressure both ways: ``can_write`` is False while ``WRITE_HIGH_WATER`` bytes wait for a
  slow client (queue actors stop delivering; ``on_unblocked`` lets them go on once it drained),
  and ``wait_drained`` holds the reader meanwhile, so TCP pushes back on a client that does
  not read what it is sent;
- heartbeats: a heartbeat frame whenever nothing was sent for an interval;
- the send counters of the connection's statistics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from ..broker.stats import ConnectionStats
from ..protocol.frames import HEARTBEAT_FRAME
from .latency_trace import TRACE

log = logging.getLogger(__name__)

# Deliveries pause while this much is waiting to be written to a slow client.
WRITE_HIGH_WATER = 4 * 1024 * 1024


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
                    if TRACE is None:
                        await self.stream.send_all(data)
                    else:
                        traced, self.traced = self.traced, []
                        started = time.perf_counter_ns()
                        await self.stream.send_all(data)
                        TRACE.sent(traced, started)
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
            self.done.set()

    async def heartbeats(self, interval: float) -> None:
        """Send a heartbeat frame whenever nothing else went out for ``interval`` seconds."""
        self._sent_at = trio.current_time()
        while True:
            await trio.sleep(interval)
            if trio.current_time() - self._sent_at >= interval:
                self.write(HEARTBEAT_FRAME)
