"""Message statistics as RabbitMQ's management API reports them: counters per object (the broker,
a vhost, a queue, an exchange, a connection, a channel) and their rates, sampled every
``SAMPLE_SECONDS`` as RabbitMQ's management agent samples them.

Responsibilities:
- ``MessageStats``: the counters, named as RabbitMQ's ``message_stats`` keys (``publish``,
  ``deliver``, ``ack``...); the hot paths increment them (``stats.publish += 1``), nothing more;
- ``StatsTotal``: the counters of an object that adds up others (a connection its channels, a
  vhost its connections, the broker its vhosts): its own counters plus its parts', summed when
  read (``counts``), so that a publish increments one channel's counter, not four; a part that
  leaves (``remove``) is folded into the total's own counters, so totals never go back;
- ``ConnectionStats``: a connection's total with RabbitMQ's socket counters too (``recv_oct``,
  ``recv_cnt``, ``send_oct``, ``send_cnt``);
- ``StatsSampler``: every ``SAMPLE_SECONDS`` it records each object's counters and the rate
  since the previous sample (a long walk yields, as every long job on the loop does);
- ``message_stats`` / ``io_stats``: one object's counters and rates as RabbitMQ's JSON:
  ``{"publish": 5, "publish_details": {"rate": 1.0}, ...}``, with ``deliver_get`` (the sum
  RabbitMQ reports); ``{}`` for an object whose counters never moved (as RabbitMQ leaves
  them out).

Read counters with ``counts()`` / ``count(name)`` (a total's attributes are its own part only).
"""

from __future__ import annotations

import bisect
import operator
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Final

import trio
import trio.lowlevel

from .pacing import Slice

SAMPLE_SECONDS: Final = 5.0

# RabbitMQ's message_stats keys, in the order its API lists them.
COUNTERS: Final = (
    "publish",
    "publish_in",
    "publish_out",
    "confirm",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "redeliver",
    "ack",
    "return_unroutable",
    "drop_unroutable",
)
# RabbitMQ's socket counters of a connection (top-level fields of its JSON, not message_stats).
IO_COUNTERS: Final = ("recv_oct", "recv_cnt", "send_oct", "send_cnt")
_DELIVER_GET: Final = ("deliver", "deliver_no_ack", "get", "get_no_ack")
_READ_COUNTERS: Final[Callable[[Any], tuple[int, ...]]] = operator.attrgetter(*COUNTERS)
_READ_ALL: Final[Callable[[Any], tuple[int, ...]]] = operator.attrgetter(*COUNTERS, *IO_COUNTERS)


class MessageStats:
    """One object's message counters (and, once sampled, their rates per second)."""

    __slots__ = (*COUNTERS, "_sampled", "_rates", "_still", "__weakref__")
    FIELDS: ClassVar[tuple[str, ...]] = COUNTERS

    def __init__(self) -> None:
        for name in self.FIELDS:
            setattr(self, name, 0)
        self._sampled: tuple[int, ...] | None = None
        self._rates: tuple[float, ...] = (0.0,) * len(self.FIELDS)
        self._still = False  # the last sample found the counters as the one before it

    # Declared for the type checker; set in __init__ (slots).
    publish: int
    publish_in: int
    publish_out: int
    confirm: int
    deliver: int
    deliver_no_ack: int
    get: int
    get_no_ack: int
    get_empty: int
    redeliver: int
    ack: int
    return_unroutable: int
    drop_unroutable: int

    def counts(self) -> tuple[int, ...]:
        """Every counter, in ``FIELDS`` order."""
        return self._own()

    def _own(self) -> tuple[int, ...]:
        return _READ_COUNTERS(self)  # one C call

    def count(self, name: str) -> int:
        return self.counts()[self.FIELDS.index(name)]

    def sample(self, seconds: float) -> None:
        """Record the counters now; the rates are the change since the last sample. An object
        whose counters did not move since a sample that found them still keeps what it has:
        sampling 100k idle queues allocates nothing that lives on."""
        counts = self.counts()
        before = self._sampled
        if counts == before and self._still:
            return
        if before is None or seconds <= 0:
            self._rates = (0.0,) * len(counts)
        else:
            self._rates = tuple(
                (now - then) / seconds for now, then in zip(counts, before, strict=True)
            )
        self._sampled = counts
        self._still = counts == before

    def rates(self) -> dict[str, float]:
        return dict(zip(self.FIELDS, self._rates, strict=True))


class StatsTotal(MessageStats):
    """The counters of an object adding up others (``parts``), plus its own."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        super().__init__()
        self.parts: set[MessageStats] = set()

    def counts(self) -> tuple[int, ...]:
        own = self._own()
        if not self.parts:
            return own
        # The message counters add up; extra fields (a connection's octets) are each one's own.
        n = len(COUNTERS)
        parts = (part.counts()[:n] for part in self.parts)
        return (*map(sum, zip(own[:n], *parts, strict=True)), *own[n:])

    def add(self, part: MessageStats) -> None:
        self.parts.add(part)

    def remove(self, part: MessageStats) -> None:
        """``part`` leaves (its object closed): its counts stay in the total, as our own."""
        if part in self.parts:
            self.parts.discard(part)
            fold(self, part)


def fold(into: MessageStats, part: MessageStats) -> None:
    """Add ``part``'s message counters to ``into``'s own (``part`` is going away)."""
    for name, value in zip(COUNTERS, part.counts(), strict=False):
        setattr(into, name, getattr(into, name) + value)


class ConnectionStats(StatsTotal):
    """A connection's: its channels' message counters and its socket's counters."""

    __slots__ = IO_COUNTERS
    FIELDS: ClassVar[tuple[str, ...]] = (*COUNTERS, *IO_COUNTERS)

    def _own(self) -> tuple[int, ...]:
        return _READ_ALL(self)

    recv_oct: int
    recv_cnt: int
    send_oct: int
    send_cnt: int


def message_stats(stats: MessageStats, keys: Iterable[str] = COUNTERS) -> dict[str, Any]:
    """RabbitMQ's ``message_stats`` object for ``stats``: empty until a counter moved, then each
    of ``keys`` (the counters RabbitMQ shows for that kind of object, zeros too) with its
    ``<name>_details`` rate, and ``deliver_get`` (deliveries and gets of every kind) where
    ``keys`` has ``deliver``."""
    counts = dict(zip(stats.FIELDS, stats.counts(), strict=True))
    rates = stats.rates()
    counts["deliver_get"] = sum(counts[name] for name in _DELIVER_GET)
    rates["deliver_get"] = sum(rates[name] for name in _DELIVER_GET)
    names = sorted({*keys, "deliver_get"} if "deliver" in keys else set(keys))
    if not any(counts[name] or rates[name] for name in names):
        return {}
    found: dict[str, Any] = {}
    for name in names:
        found[name] = counts[name]
        found[f"{name}_details"] = {"rate": round(rates[name], 1)}
    return found


def io_stats(stats: ConnectionStats) -> dict[str, Any]:
    """A connection's socket counters as RabbitMQ's connection JSON has them (top level):
    ``recv_oct``, ``recv_oct_details``, ``recv_cnt``, ``send_oct``, ... (all of them, zeros
    too, as RabbitMQ lists them)."""
    counts = dict(zip(stats.FIELDS, stats.counts(), strict=True))
    rates = stats.rates()
    found: dict[str, Any] = {}
    for name in IO_COUNTERS:
        found[name] = counts[name]
        found[f"{name}_details"] = {"rate": round(rates[name], 1)}
    return found


StatsSource = Callable[[], Iterable[MessageStats]]


class StatsSampler:
    """Samples every ``MessageStats`` it knows every ``interval`` seconds (``run``: a task of
    the broker's nursery): those registered (weakly: a closed channel's leave with it) and
    those its sources give (the broker walks its vhosts, queues and exchanges). ``interval``
    defaults to ``SAMPLE_SECONDS`` as it is when the sampler is made (tests shorten it)."""

    def __init__(self, interval: float | None = None) -> None:
        self.interval = SAMPLE_SECONDS if interval is None else interval
        self._registered: weakref.WeakSet[MessageStats] = weakref.WeakSet()
        self._sources: list[StatsSource] = []
        self._last = time.monotonic()
        self.samples = 0  # how many rounds so far

    def register(self, stats: MessageStats) -> MessageStats:
        self._registered.add(stats)
        return stats

    def new(self) -> MessageStats:
        """A registered ``MessageStats``."""
        return self.register(MessageStats())

    def add_source(self, source: StatsSource) -> None:
        self._sources.append(source)

    async def sample_all(self) -> None:
        now = time.monotonic()
        seconds, self._last = now - self._last, now
        work = Slice()
        for stats in list(self._registered):
            stats.sample(seconds)
            if work.used():
                await trio.lowlevel.checkpoint()
        for source in self._sources:
            for stats in source():
                stats.sample(seconds)
                if work.used():
                    await trio.lowlevel.checkpoint()
        self.samples += 1

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval)
            await self.sample_all()


class Histogram:
    """Observations counted in buckets (upper bounds, ascending; ``+Inf`` implied), with their
    sum: what a Prometheus histogram exports, kept without a lock or a call per bucket."""

    __slots__ = ("bounds", "buckets", "count", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.buckets = [0] * (len(self.bounds) + 1)  # not cumulative; the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, observations <= it)`` pairs, ``+Inf`` last (Prometheus' form)."""
        found, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.buckets, strict=True):
            total += count
            found.append((bound, total))
        return found


# fsync (a flush's work) latency buckets, seconds; group-commit batch sizes, requests per flush.
FSYNC_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
