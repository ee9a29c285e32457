"""A stream's open record batch: appended records not yet in its log.

Appends collect in the open batch, written into the log as one frame (one header, one CRC, one
index entry, one cache entry: ``Log.append_batch``) when anything reads or flushes the stream,
or when it reaches ``MAX_BATCH_RECORDS`` / ``MAX_BATCH_BYTES``: so the publishes of one read
buffer (and of every connection served before the next flush) become one batch. A batch fills
a segment at most (unless one record is bigger), and every record in it is persistent: a stream
keeps what it is given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter

from ...model import Message
from .format import BATCH_OVERHEAD, ENTRY_OVERHEAD, FLAG_PERSISTENT
from .log import Log

MAX_BATCH_RECORDS = 4096
MAX_BATCH_BYTES = 1024 * 1024
_exchange = attrgetter("exchange")
_routing_key = attrgetter("routing_key")
_properties_raw = attrgetter("properties_raw")
_body = attrgetter("body")
_timestamp = attrgetter("timestamp_ms")


class OpenBatch:
    """The records appended to a stream and not yet sealed into its log, in order."""

    def __init__(self, log: Log) -> None:
        self.log = log
        # (timestamp_ms, flags, message); a message never stamped (0) gets the time of the
        # seal.
        self.entries: list[tuple[int, int, Message]] = []
        self._bytes = 0
        # Changes each time the batch is sealed and each time a flush begins: appends under
        # one generation are made durable by the same flush (``StreamLog.batch_generation``).
        self.generation = 0

    def add(self, messages: Sequence[Message]) -> tuple[int, OSError | None]:
        """Add records, in order: how many were, and the ``OSError`` that refused the next
        one (the batch would overflow the active segment and could not be written out to make
        room), else None."""
        log = self.log
        segment_bytes = log.segment_bytes
        batch, total = self.entries, self._bytes
        left = segment_bytes - log.segments[-1].size  # in the active segment
        # Most runs fit in the open batch and the active segment: added at once (C-level
        # loops), with the outcome of the loop below, which would seal nothing.
        count = len(messages)
        if not count:
            return 0, None
        grown = (total if batch else BATCH_OVERHEAD) + ENTRY_OVERHEAD * count
        grown += sum(map(len, map(_exchange, messages)))
        grown += sum(map(len, map(_routing_key, messages)))
        grown += sum(map(len, map(_properties_raw, messages)))
        grown += sum(map(len, map(_body, messages)))
        if grown <= left and grown < MAX_BATCH_BYTES and len(batch) + count < MAX_BATCH_RECORDS:
            if not batch:
                log.changed()  # the next flush seals and writes the batch
            batch.extend(zip(map(_timestamp, messages), repeat(FLAG_PERSISTENT), messages))
            self._bytes = grown
            return count, None
        appended = 0
        try:
            for message in messages:
                size = (
                    ENTRY_OVERHEAD
                    + len(message.exchange)
                    + len(message.routing_key)
                    + len(message.properties_raw)
                    + len(message.body)
                )
                # A batch fills a segment at most (unless one record is bigger), or a whole
                # segment if it would roll anyway; and ``MAX_BATCH_BYTES`` at most, unless one
                # record is bigger: then it is a frame of its own (a batch of a near-1 MiB and
                # a 512 MiB message would be longer than any frame a reader accepts).
                if batch and (
                    total + size > (left if left >= total else segment_bytes)
                    or total + size > MAX_BATCH_BYTES
                ):
                    self._bytes = total
                    self.seal()
                    batch, total = self.entries, 0
                    left = segment_bytes - log.segments[-1].size
                if not batch:
                    total = BATCH_OVERHEAD
                    log.changed()  # the next flush seals and writes the batch
                batch.append((message.timestamp_ms, FLAG_PERSISTENT, message))
                total += size
                appended += 1
                if len(batch) >= MAX_BATCH_RECORDS or total >= MAX_BATCH_BYTES:
                    # The record is in the batch now: a failure to write it out (no descriptor
                    # for a new segment) is the next flush's to retry and report, not this
                    # publish's.
                    self._bytes = total
                    with contextlib.suppress(OSError):
                        self.seal()
                    batch, total = self.entries, self._bytes
                    left = segment_bytes - log.segments[-1].size
        except OSError as exc:
            return appended, exc
        finally:
            self._bytes = total
        return appended, None

    def seal(self) -> None:
        """Write the batch into the log (buffered, as one frame). Raises OSError when the log
        cannot take it (a segment to roll to cannot be created): the batch then stays open,
        its offsets kept, and the next seal tries again."""
        if self.entries:
            self.log.append_batch(self.entries)  # all or nothing
            self.entries, self._bytes = [], 0
            self.generation += 1
