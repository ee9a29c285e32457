"""Message statistics as RabbitMQ's management API reports them: counters per object (the broker,
a vhost, a queue, an exchange, a connection, a channel) and their rates, sampled every
``SAMPLE_SECONDS`` as RabbitMQ's management agent samples them.

Responsibilities:
- ``MessageStats``: the counters, named as RabbitMQ's ``message_stats`` keys (``publish``,
  ``deliver``, ``ack``...); the hot paths increment them (``stats.publish += 1``), nothing more;
- ``StatsSampler``: every ``SAMPLE_SECONDS`` it records each registered object's counters and
  the rate since the previous sample (a long walk yields, as every long job on the loop does);
- ``message_stats``: one object's counters and rates as RabbitMQ's JSON: ``{"publish": 5,
  "publish_details": {"rate": 1.0}, ...}``, with ``deliver_get`` (the sum RabbitMQ reports)
  ``{}`` for an object whose counters never moved (as RabbitMQ leaves them out).
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Final

import trio

from .pacing import Pacer

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


class MessageStats:
    """One object's message counters (and, once sampled, their rates per second)."""

    __slots__ = (*COUNTERS, "_sampled", "_rates", "__weakref__")

    def __init__(self) -> None:
        for name in COUNTERS:
            setattr(self, name, 0)
        self._sampled: tuple[int, ...] | None = None
        self._rates: tuple[float, ...] = (0.0,) * len(COUNTERS)

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
        return tuple(getattr(self, name) for name in COUNTERS)

    def sample(self, seconds: float) -> None:
        """Record the counters now; the rates are the change since the last sample."""
        counts = self.counts()
        before = self._sampled
        if before is None or seconds <= 0:
            self._rates = (0.0,) * len(COUNTERS)
        else:
            self._rates = tuple(
                (now - then) / seconds for now, then in zip(counts, before, strict=True)
            )
        self._sampled = counts

    def rates(self) -> dict[str, float]:
        return dict(zip(COUNTERS, self._rates, strict=True))


def message_stats(stats: MessageStats, keys: tuple[str, ...] = COUNTERS) -> dict[str, Any]:
    """RabbitMQ's ``message_stats`` object for ``stats``: empty until a counter moved, then
    each of ``keys`` (the counters RabbitMQ shows for that kind of object) with its
    ``<name>_details`` rate, and ``deliver_get`` (deliveries and gets of every kind)."""
    counts = dict(zip(COUNTERS, stats.counts(), strict=True))
    rates = stats.rates()
    counts["deliver_get"] = sum(
        counts[name] for name in ("deliver", "deliver_no_ack", "get", "get_no_ack")
    )
    rates["deliver_get"] = sum(
        rates[name] for name in ("deliver", "deliver_no_ack", "get", "get_no_ack")
    )
    if not any(counts[name] or rates[name] for name in keys):
        return {}
    shown = sorted({*keys, "deliver_get"} if "deliver" in keys else set(keys))
    found: dict[str, Any] = {}
    for name in shown:
        found[name] = counts[name]
        found[f"{name}_details"] = {"rate": round(rates[name], 1)}
    return found


class StatsSampler:
    """Samples every registered ``MessageStats`` every ``SAMPLE_SECONDS`` (``run``: a task of
    the broker's nursery). Registration is weak: a deleted queue's stats leave with it."""

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        self.interval = interval
        self._registered: weakref.WeakSet[MessageStats] = weakref.WeakSet()
        self._last = time.monotonic()

    def register(self, stats: MessageStats) -> MessageStats:
        self._registered.add(stats)
        return stats

    def new(self) -> MessageStats:
        """A registered ``MessageStats``."""
        return self.register(MessageStats())

    async def sample_all(self) -> None:
        now = time.monotonic()
        seconds, self._last = now - self._last, now
        pacer = Pacer()
        for stats in list(self._registered):
            stats.sample(seconds)
            await pacer.step()

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval)
            await self.sample_all()
