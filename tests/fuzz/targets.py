"""Every fuzz target, by name (importing this registers them all)."""

from __future__ import annotations

from . import amqp_targets, http_targets, log_targets
from .common import TARGETS, Target, check

# The combined target ``all`` picks a target by its first byte, in this order.
ORDER = tuple(sorted(TARGETS))


def run_any(data: bytes) -> None:
    """The target the first byte names, on the rest (the ``all`` target)."""
    if not data:
        return
    TARGETS[ORDER[data[0] % len(ORDER)]].run(data[1:])


__all__ = [
    "ORDER",
    "TARGETS",
    "Target",
    "amqp_targets",
    "check",
    "http_targets",
    "log_targets",
    "run_any",
]
