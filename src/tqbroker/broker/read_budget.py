"""The read budget: the bytes that read responses hold, across the broker (the HTTP topic API's
record, columnar and frame reads; the Kafka Fetch when it lands), and the bodies that stream
under it.

A read builds its answer from the log. Unbounded, 32 concurrent reads of 64 MiB held 2.2 GB,
set the memory alarm and so blocked every AMQP publisher for seconds: reads must stay within
memory of their own, below the watermark, so that they never set the alarm that blocks
publishers.

Responsibilities:
- ``ReadBudget``: a byte-counting semaphore, first come first served. A read reserves the
  bytes of the piece of its answer it is about to build, and releases them once that piece is
  written out; at most ``limit`` bytes are reserved at once, except that a piece larger than
  the whole budget is let in alone (when nothing else is reserved). A read reserves only while
  it holds nothing else of the budget (``ReadBody`` keeps to this), so reads never deadlock.
- admission (``admit``, before a read takes anything from the log): while the memory alarm is
  set a new read waits for it to clear, at most ``patience`` seconds, then is refused
  (``LowOnMemory``: the HTTP API answers 503 with ``Retry-After``). Reads under way go on:
  what they hold is bounded by the budget, and stopping them would free nothing more.
- ``ReadBody``: an answer as a series of ``Piece``s (the bytes to reserve and how to build
  them), each reserved, built, handed out in slices of at most ``SLICE_BYTES`` and released
  when the next is asked for (its slices have been written out by then) or the body is closed.
  A piece that comes out bigger than its reservation keeps the difference if the budget has
  room for it now, else it is dropped and built again once its size is reserved (the second
  build is kept whatever its size).
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Final

import attrs
import trio

from .alarms import MEMORY, ResourceAlarms

# The budget is this share of the memory high watermark (the incomplete message bodies of AMQP
# publishers have another tenth): reads held by slow clients leave room for everything else.
BUDGET_FRACTION: Final = 0.1
MIN_BUDGET: Final = 8 * 1024 * 1024
# How long a new read waits for the memory alarm to clear before it is refused.
ADMIT_PATIENCE: Final = 5.0
# What a refused reader is told to wait before it asks again (seconds: HTTP's Retry-After).
RETRY_AFTER: Final = 1
# The most a body hands out at once (a piece bigger than this goes out in several slices).
SLICE_BYTES: Final = 1024 * 1024


class LowOnMemory(Exception):
    """A read refused: the memory alarm stayed set for the budget's ``patience``."""

    def __init__(self, measured: str, retry_after: int = RETRY_AFTER) -> None:
        super().__init__(
            f"the broker is low on memory ({measured}): reads wait while the memory alarm "
            f"is set, and this one waited too long; retry in {retry_after} s"
        )
        self.message = str(self)
        self.retry_after = retry_after


class ReadCut(Exception):
    """A streamed read could not go on (the log changed under it, or it went away): the rest
    of the body cannot be what its start promised, so the response is cut short."""


def budget_for(watermark: int) -> int:
    """The broker's read budget for a memory high watermark of ``watermark`` bytes."""
    return max(int(watermark * BUDGET_FRACTION), MIN_BUDGET)


@attrs.define(eq=False)
class _Waiter:
    size: int
    granted: trio.Event = attrs.Factory(trio.Event)


class ReadBudget:
    """Bytes held by read responses across the broker (see the module doc)."""

    def __init__(
        self,
        limit: int,
        alarms: ResourceAlarms | None = None,
        *,
        patience: float = ADMIT_PATIENCE,
    ) -> None:
        self.limit = limit
        self.alarms = alarms if alarms is not None else ResourceAlarms()
        self.patience = patience
        self.in_use = 0  # bytes reserved now
        self.peak = 0  # the most ever reserved at once (metrics, tests)
        self._waiters: collections.deque[_Waiter] = collections.deque()

    @property
    def waiting(self) -> int:
        """Reads waiting for room."""
        return len(self._waiters)

    async def admit(self) -> None:
        """Before a read begins: wait while the memory alarm is set, at most ``patience``
        seconds (``LowOnMemory`` then)."""
        if MEMORY not in self.alarms.active:
            await trio.lowlevel.checkpoint()
            return
        with trio.move_on_after(self.patience):
            await self.alarms.wait_cleared(MEMORY)
            return
        raise LowOnMemory(self.alarms.active.get(MEMORY, "memory alarm set"))

    async def reserve(self, size: int) -> None:
        """Take ``size`` bytes, waiting (behind earlier reservations) until they fit. Call it
        only while holding nothing else of the budget."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._waiters and self._fits(size):
            self._take(size)  # then a checkpoint that cannot raise: taken means returned
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(size)
        self._waiters.append(waiter)
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():  # granted as it was cancelled
                self.release(size)
            else:
                self._waiters.remove(waiter)
                self._grant()  # the head may have gone: those behind it may fit
            raise

    def release(self, size: int) -> None:
        """Give back ``size`` bytes taken by ``reserve``."""
        self.in_use -= size
        assert self.in_use >= 0, "released more than was reserved"
        self._grant()

    def try_reserve(self, size: int) -> bool:
        """Take ``size`` bytes if they fit now and nobody waits (no waiting: a read may call
        it while it holds some); True if taken."""
        if self._waiters or self.in_use + size > self.limit:
            return False
        self._take(size)
        return True

    def charge(self, size: int) -> None:
        """Count ``size`` bytes more without waiting (bytes already built: a piece that grew
        between its two builds); ``release`` them as the others."""
        self._take(size)

    def _fits(self, size: int) -> bool:
        return self.in_use + size <= self.limit or self.in_use == 0

    def _take(self, size: int) -> None:
        self.in_use += size
        self.peak = max(self.peak, self.in_use)

    def _grant(self) -> None:
        """Let in the waiters at the head that fit now, in order."""
        waiters = self._waiters
        while waiters and self._fits(waiters[0].size):
            waiter = waiters.popleft()
            self._take(waiter.size)
            waiter.granted.set()


@attrs.frozen
class Piece:
    """A piece of a read's answer: the bytes to reserve before it is built, and how."""

    size: int
    build: Callable[[], Awaitable[bytes]]


class ReadBody:
    """A read's answer streamed under the budget, a piece at a time (see the module doc).
    ``start`` builds the first piece (what fails before anything is sent fails there);
    iterating hands out the slices; ``close`` (always call it) gives back what the body
    holds. ``length``: the bytes in all, when known beforehand or once ``start`` has found the
    body is one piece (else None)."""

    def __init__(self, budget: ReadBudget, pieces: Iterable[Piece], length: int | None) -> None:
        self.budget = budget
        self.length = length
        self._pieces: Iterator[Piece] = iter(pieces)
        self._ahead: Piece | None = None  # the next piece, looked at by ``start``
        self._held = 0
        self._data: bytes = b""
        self._at = 0
        self._started = False

    async def start(self) -> None:
        """Build the first piece (if not done)."""
        if self._started:
            return
        self._started = True
        await self._next_piece()
        if self.length is None:
            self._ahead = next(self._pieces, None)
            if self._ahead is None:
                self.length = len(self._data)

    def __aiter__(self) -> ReadBody:
        return self

    async def __anext__(self) -> bytes:
        await self.start()
        while self._at >= len(self._data):
            if not await self._next_piece():
                raise StopAsyncIteration
        at, data = self._at, self._data
        self._at = at + SLICE_BYTES
        if at == 0 and len(data) <= SLICE_BYTES:
            return data  # the piece as built: no copy
        return data[at : at + SLICE_BYTES]

    async def read_all(self) -> bytes:
        """The whole answer in one bytes object (for callers that need it whole: small
        answers, tests), the body closed."""
        try:
            return b"".join([chunk async for chunk in self])
        finally:
            self.close()

    def close(self) -> None:
        """Give back what the body holds (it hands out nothing more)."""
        self._data, self._at = b"", 0
        self._pieces, self._ahead = iter(()), None
        self._give_back()

    async def _next_piece(self) -> bool:
        """Release the piece handed out, reserve and build the next; False at the end."""
        self._data, self._at = b"", 0
        self._give_back()
        piece, self._ahead = self._ahead or next(self._pieces, None), None
        if piece is None:
            return False
        data = await self._built(piece.size, piece)
        if len(data) > self._held and self.budget.try_reserve(len(data) - self._held):
            self._held = len(data)  # bigger than reserved, but there was room: kept
        elif len(data) > self._held:  # dropped, and built again under its size
            size = len(data)
            del data
            self._give_back()
            data = await self._built(size, piece)
            if len(data) > self._held:  # it grew again meanwhile: kept, and counted
                self.budget.charge(len(data) - self._held)
                self._held = len(data)
        elif len(data) < self._held:  # the rest of the reservation is not needed
            self.budget.release(self._held - len(data))
            self._held = len(data)
        self._data = data
        return True

    async def _built(self, size: int, piece: Piece) -> bytes:
        await self.budget.reserve(size)
        self._held = size
        return await piece.build()

    def _give_back(self) -> None:
        held, self._held = self._held, 0
        if held:
            self.budget.release(held)
