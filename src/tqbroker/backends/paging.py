"""Messages of a long in-memory queue paged out to disk (RabbitMQ's classic queues do the same).

A ``PageFile`` holds the tail of one queue's ready messages, in the log's record format
(``log/format.py``: length, CRC-32C, the message id as the offset, timestamp, exchange, routing
key, properties, body): appended at the end, read back in order from the front, in segment files
of ``SEGMENT_BYTES`` that are deleted once read. Nothing in memory grows with the number of
messages paged out: a buffer of at most ``WRITE_BUFFER`` bytes and one entry per segment.

It is not storage: nothing is fsync'd, the files are removed when the queue is deleted or the
backend closes, and a broker that restarts wipes them (transient messages do not survive).
Writes and reads are small, sequential and mostly in the page cache; they run on the caller's
thread, as the log backend's reads do.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections import deque
from pathlib import Path
from typing import Final

from ..model import Message
from .log.format import decode_record, encode_record

_LENGTH: Final = struct.Struct(">I")

SEGMENT_BYTES: Final = 64 * 1024 * 1024
WRITE_BUFFER: Final = 256 * 1024
READ_CHUNK: Final = 1024 * 1024


class _Segment:
    __slots__ = ("fd", "path", "read_at", "size")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.size = 0  # bytes written to the file
        self.read_at = 0  # the next record starts here

    def drop(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


class PageFile:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._name = uuid.uuid4().hex
        self._segments: deque[_Segment] = deque()
        self._numbers = 0
        self._buffer = bytearray()  # appended records not yet written to the last segment
        self.count = 0  # messages paged out and not yet read back
        self.bytes = 0  # their bodies' bytes

    def append(self, message_id: int, message: Message) -> None:
        """Page out one message (``OSError`` if the disk refuses; nothing is then added)."""
        record = encode_record(message_id, message.timestamp_ms, 0, message)
        if not self._segments or self._segments[-1].size + len(self._buffer) >= SEGMENT_BYTES:
            self._write_out()
            self._segments.append(self._new_segment())
        self._buffer += record
        if len(self._buffer) >= WRITE_BUFFER:
            try:
                self._write_out()
            except OSError:
                del self._buffer[-len(record) :]  # this one is refused; the rest waits
                raise
        self.count += 1
        self.bytes += len(message.body)

    def take(self, max_count: int) -> list[tuple[int, Message]]:
        """Read back up to ``max_count`` messages from the front, in order."""
        taken: list[tuple[int, Message]] = []
        while len(taken) < min(max_count, self.count):
            head = self._segments[0]
            if len(self._segments) == 1:
                self._write_out()  # the front segment is the one being written
            if head.read_at >= head.size:
                self._segments.popleft().drop()
                continue
            chunk = os.pread(head.fd, READ_CHUNK, head.read_at)
            pos = 0
            while len(taken) < min(max_count, self.count):
                record = decode_record(chunk, pos)
                if record is None:
                    break
                taken.append((record.offset, record.message))
                pos += record.size
            if pos == 0:  # one record larger than the chunk: read it whole
                (length,) = _LENGTH.unpack_from(chunk, 0)
                record = decode_record(os.pread(head.fd, 4 + length, head.read_at), 0)
                assert record is not None
                taken.append((record.offset, record.message))
                pos = record.size
            head.read_at += pos
        for _id, message in taken:
            self.count -= 1
            self.bytes -= len(message.body)
        if not self.count:
            self.clear()
        return taken

    def clear(self) -> None:
        """Forget every paged-out message and remove the files."""
        self._buffer.clear()
        while self._segments:
            self._segments.popleft().drop()
        self.count = self.bytes = 0

    def _new_segment(self) -> _Segment:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._numbers += 1
        return _Segment(self.directory / f"{self._name}-{self._numbers:08d}.page")

    def _write_out(self) -> None:
        buffer = self._buffer
        if not buffer:
            return
        segment = self._segments[-1]
        written = os.pwrite(segment.fd, buffer, segment.size)
        while written < len(buffer):  # a short write: rare, finish it
            written += os.pwrite(segment.fd, buffer[written:], segment.size + written)
        segment.size += len(buffer)
        buffer.clear()
