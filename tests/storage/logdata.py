"""Shared helpers for the ``log`` backend tests: random messages, a small ``Log`` on disk, and
record comparison."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tqbroker.backends.log.format import Record, decode_record
from tqbroker.backends.log.log import Log
from tqbroker.model import Message
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.methods import BasicProperties

# Small enough that a few hundred records make several segments and many index entries.
SEGMENT_BYTES = 4096
INDEX_INTERVAL = 256
T0 = 1_700_000_000_000  # ms


def open_log(directory: Path, *, recovery_point: int = 0) -> tuple[Log, bool]:
    log = Log(directory, segment_bytes=SEGMENT_BYTES, index_interval_bytes=INDEX_INTERVAL)
    clean = log.open(recovery_point=recovery_point)
    return log, clean


def _text(rng: random.Random, max_chars: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789.-_#*/é漢🐇"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_chars)))


def _headers(rng: random.Random) -> FieldTable:
    return {"k": _text(rng, 10), "n": rng.randint(-5, 5)}


def random_message(rng: random.Random, max_body: int = 400, min_body: int = 0) -> Message:
    properties = BasicProperties(
        content_type=rng.choice([None, "application/json", "text/plain"]),
        delivery_mode=rng.choice([None, 1, 2]),
        priority=rng.choice([None, rng.randint(0, 9)]),
        correlation_id=rng.choice([None, _text(rng, 20)]),
        headers=rng.choice([None, _headers(rng)]),
        timestamp=rng.choice([None, rng.randint(0, 2**40)]),
    )
    # Keep the shortstrs within 255 bytes: at most 60 characters of up to 4 UTF-8 bytes.
    return Message(
        rng.choice(["", "amq.direct", _text(rng, 60)]),
        _text(rng, 60),
        properties.encode(),
        rng.randbytes(rng.randint(min_body, max_body)),
    )


@dataclass(frozen=True)
class Expected:
    """What was appended at one offset."""

    offset: int
    timestamp_ms: int
    flags: int
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes


def append_random(
    log: Log, rng: random.Random, count: int, ts: int, max_body: int = 400, min_body: int = 0
) -> tuple[list[Expected], int]:
    """Append ``count`` random records with non-decreasing timestamps starting at ``ts``;
    return what was appended and the next timestamp."""
    appended = []
    for _ in range(count):
        ts += rng.choice([0, 1, 1, 2, 7])
        message = random_message(rng, max_body, min_body)
        flags = rng.choice([0, 1])
        offset = log.append(message, flags, ts)
        appended.append(
            Expected(
                offset,
                ts,
                flags,
                message.exchange,
                message.routing_key,
                message.properties_raw,
                message.body,
            )
        )
    return appended, ts


def as_expected(record: Record | None) -> Expected | None:
    if record is None:
        return None
    m = record.message
    return Expected(
        record.offset,
        record.timestamp_ms,
        record.flags,
        m.exchange,
        m.routing_key,
        bytes(m.properties_raw),
        bytes(m.body),
    )


def assert_log_holds(log: Log, expected: list[Expected]) -> None:
    """The log holds exactly ``expected`` (offsets 0..n-1), byte for byte, and nothing more."""
    assert log.start_offset == 0
    assert log.next_offset == len(expected)
    for want in expected:
        assert as_expected(log.reader.read(want.offset)) == want, want.offset
    assert log.reader.read(len(expected)) is None
    assert log.reader.corrupt_records == 0


def first_at_or_after(expected: list[Expected], ts: int) -> int:
    """The reference answer for ``offset_for_timestamp`` (timestamps are non-decreasing)."""
    for e in expected:
        if e.timestamp_ms >= ts:
            return e.offset
    return len(expected)


def sync(log: Log) -> None:
    work = log.sync_work()
    if work is not None:
        work()


def segment_files(directory: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.suffix in (".log", ".index", ".timeindex")
    }


def record_bounds(path: Path) -> list[tuple[int, int]]:
    """(start, end) byte positions of every record in a segment file."""
    data = path.read_bytes()
    bounds, pos = [], 0
    while pos < len(data):
        record = decode_record(data, pos)
        assert record is not None
        bounds.append((pos, pos + record.size))
        pos += record.size
    return bounds
