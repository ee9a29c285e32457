"""Retention of a log, Kafka's way: per whole segment, by size and by age."""

from __future__ import annotations

from collections.abc import Sequence

from .segment import Segment


def past_retention(
    segments: Sequence[Segment], max_bytes: int | None, max_age_ms: int | None, now_ms: int
) -> int:
    """How many of the oldest segments retention removes: while dropping the oldest still
    leaves at least ``max_bytes``, or while the oldest's newest record is older than
    ``max_age_ms``. The last (active) segment always stays."""
    total = sum(s.size for s in segments)
    count = 0
    while count < len(segments) - 1:
        oldest = segments[count]
        too_big = max_bytes is not None and total - oldest.size >= max_bytes
        too_old = max_age_ms is not None and oldest.max_timestamp < now_ms - max_age_ms
        if not (too_big or too_old):
            break
        total -= oldest.size
        count += 1
    return count
