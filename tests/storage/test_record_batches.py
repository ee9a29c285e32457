"""Stream record batches (storage format 2): the codec, recovery of batches, and the upgrade
path: a stream written by tqbroker before batches (format 1, single records only; the files in
``tests/data/stream-log-format1`` were written by the log backend at commit c8119f2) opens,
reads, takes batches after its records and survives a crash."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.storage import flush
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.batching import MAX_BATCH_BYTES, MAX_BATCH_RECORDS
from tqbroker.backends.log.format import (
    FLAG_BATCH,
    HEAD_SIZE,
    RECORD_FIXED,
    Batch,
    RecordError,
    decode_frame,
    encode_batch,
    parse_frame,
)
from tqbroker.backends.log.log import Log
from tqbroker.backends.log.stream import LogStream
from tqbroker.broker.arguments import QueueArguments
from tqbroker.broker.flusher import Flusher
from tqbroker.broker.streams.queue import StreamQueue
from tqbroker.model import Message
from tqbroker.protocol.methods import BasicProperties

FORMAT1 = Path(__file__).resolve().parents[1] / "data" / "stream-log-format1"
T0 = 1_700_000_000_000

entries = st.lists(
    st.tuples(
        st.integers(0, 2**63 - 1),  # timestamp_ms
        st.sampled_from([0, 1]),  # flags
        st.text(max_size=20),  # exchange
        st.text(max_size=20),  # routing key
        st.binary(max_size=40),  # properties
        st.binary(max_size=300),  # body
    ),
    min_size=1,
    max_size=20,
)


def _messages(
    drawn: list[tuple[int, int, str, str, bytes, bytes]],
) -> list[tuple[int, int, Message]]:
    return [
        (stamp, flags, Message(exchange[:60], key[:60], props, body))
        for stamp, flags, exchange, key, props, body in drawn
    ]


@settings(max_examples=300, deadline=None)
@given(entries, st.integers(0, 2**40), st.sampled_from(range(5)))
def test_a_batch_decodes_to_its_records(drawn: list, base: int, codec: int) -> None:  # type: ignore[type-arg]
    """Plain, and with each codec (gzip, snappy, lz4, zstd: ``x-stream-compression-type``;
    entries that do not compress are stored plain)."""
    batch = _messages(drawn)
    raw = encode_batch(base, batch, codec)
    frame = decode_frame(raw, 0)
    assert frame is not None
    assert frame.size == len(raw)
    assert [r.offset for r in frame.records] == list(range(base, base + len(batch)))
    assert frame.last_offset == base + len(batch) - 1
    assert frame.timestamp_ms == max(stamp for stamp, _, _ in batch)
    for record, (stamp, flags, message) in zip(frame.records, batch, strict=True):
        assert record.timestamp_ms == stamp == record.message.timestamp_ms
        assert record.flags == flags
        got = record.message
        assert (got.exchange, got.routing_key) == (message.exchange, message.routing_key)
        assert (got.properties_raw, got.body) == (message.properties_raw, message.body)
        # What deliveries and the bulk read copy out, without building the message.
        names, properties, body = record.parts()
        exchange, key = message.exchange.encode(), message.routing_key.encode()
        assert names == bytes((len(exchange),)) + exchange + bytes((len(key),)) + key
        assert (properties, bytes(body)) == (message.properties_raw, message.body)
        key_bytes, value = record.key_and_value
        assert (key_bytes, bytes(value)) == (key, message.body)
    again = parse_frame(raw)  # the cache's path: no CRC
    assert [r.message.body for r in again.records] == [m.body for _, _, m in batch]
    if len(batch) > 1:
        assert isinstance(frame, Batch)


@settings(max_examples=150, deadline=None)
@given(entries, st.data())
def test_a_damaged_or_cut_batch_is_never_read_as_records(drawn: list, data: st.DataObject) -> None:  # type: ignore[type-arg]
    raw = bytearray(encode_batch(7, _messages(drawn), data.draw(st.sampled_from(range(5)))))
    cut = data.draw(st.integers(0, len(raw) - 1))
    assert decode_frame(bytes(raw[:cut]), 0) is None  # a torn write: not there yet
    at = data.draw(st.integers(HEAD_SIZE - 4, len(raw) - 1))  # past the length field
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(RecordError):
        decode_frame(bytes(raw), 0)


# Names of up to 255 bytes: random bytes, UTF-8 text, and text after a lone continuation byte
# (with a length byte of 0xC2-0xDF before it, the two together read as one valid character).
names = st.one_of(
    st.binary(max_size=255),
    st.text(max_size=60).map(lambda t: t.encode()[:200]),
    st.builds(lambda c, n: bytes((c,)) + b"a" * n, st.integers(0x80, 0xBF), st.integers(0, 254)),
)


@settings(max_examples=300, deadline=None)
@given(names, names, st.booleans())
@example(b"\xa9" + b"a" * 193, b"k", False)  # length 0xC2, then 0xA9: U+00A9 if read as one
@example(b"e", b"\xa9" + b"a" * 193, True)
def test_names_that_are_not_utf8_are_refused(exchange: bytes, key: bytes, batch: bool) -> None:
    """A frame whose CRC is right but whose exchange or routing key is not UTF-8 (its length
    byte need not be ASCII) is refused whole, as a damaged one."""
    placeholder = Message("e" * len(exchange), "k" * len(key), b"", b"body")
    raw = bytearray(encode_batch(3, [(T0, 0, placeholder)] * (2 if batch else 1)))
    names = bytes((len(exchange),)) + exchange + bytes((len(key),)) + key
    wanted = bytes((len(exchange),)) + b"e" * len(exchange) + bytes((len(key),)) + b"k" * len(key)
    at = raw.index(wanted)
    raw[at : at + len(names)] = names
    raw[4:8] = google_crc32c.value(bytes(raw[8:])).to_bytes(4, "big")
    try:
        exchange.decode(), key.decode()
    except UnicodeDecodeError:
        with pytest.raises(RecordError):
            decode_frame(bytes(raw), 0)
        return
    frame = decode_frame(bytes(raw), 0)
    assert frame is not None
    got = frame.records[0].message
    assert (got.exchange, got.routing_key) == (exchange.decode(), key.decode())


def _copy_format1(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(FORMAT1, root)
    return root


def _open(root: Path) -> tuple[LogBackend, LogStream]:
    backend = LogBackend(segment_bytes=1 << 20, index_interval_bytes=256)
    backend.open(root)
    stream = backend.open_stream("/", "orders")
    assert isinstance(stream, LogStream)
    return backend, stream


def _check_format1_records(stream: LogStream) -> None:
    """The 40 records the fixture was written with (see the module doc)."""
    records = stream.read_many(0, stream.durable_end, 1000)
    assert [r.offset for r in records[:40]] == list(range(40))
    for n, record in enumerate(records[:40]):
        message = record.message
        assert message.body == b"body-%03d" % n + b"." * (n * 7 % 50)
        assert (message.exchange, message.routing_key) == ("ex", f"key{n % 4}")
        assert record.timestamp_ms == T0 + n * 10
        if n % 3:
            assert message.properties.headers == {"n": n}
            assert message.properties.delivery_mode == 2


@pytest.mark.parametrize("clean", [True, False], ids=["clean-stop", "after-a-crash"])
def test_a_format_1_stream_opens_and_reads(tmp_path: Path, clean: bool) -> None:
    root = _copy_format1(tmp_path)
    if not clean:  # recovery rescans what the checkpoint does not vouch for
        for marker in root.glob("log/*/clean-shutdown"):
            marker.unlink()
    backend, stream = _open(root)
    assert (stream.first_offset, stream.next_offset, stream.durable_end) == (0, 40, 40)
    _check_format1_records(stream)
    assert stream.offsets == {"tracked": 17}
    assert stream.group_offsets == {"g1": 23}
    assert stream.offset_for_timestamp(T0 + 255) == 26
    record = stream.read(25)
    assert record is not None
    assert record.message.routing_key == "key1"
    backend.close()


def _frames(directory: Path) -> list[tuple[int, bool]]:
    """(first offset, is a batch) of every frame of every segment file, in order."""
    found = []
    for path in sorted(directory.glob("*.log")):
        raw = path.read_bytes()
        pos = 0
        while pos < len(raw):
            offset, _stamp, flags = RECORD_FIXED.unpack_from(raw, pos + HEAD_SIZE)
            found.append((offset, bool(flags & FLAG_BATCH)))
            pos += 4 + int.from_bytes(raw[pos : pos + 4], "big")
    return found


@pytest.mark.parametrize("crash", [False, True], ids=["clean-stop", "crash"])
def test_a_format_1_stream_takes_batches_after_its_records(tmp_path: Path, crash: bool) -> None:
    root = _copy_format1(tmp_path)
    (directory,) = root.glob("log/*")
    before = {p.name: p.read_bytes() for p in directory.glob("*.log")}
    backend, stream = _open(root)
    properties = BasicProperties(delivery_mode=2).encode()
    for n in range(40, 140):
        stream.append(Message("ex", "new", properties, b"new-%03d" % n, timestamp_ms=T0 + 1000 + n))
        if n % 25 == 24:
            flush(backend)  # batches 40-49, 50-74, 75-99, 100-124, then 125-139
    flush(backend)
    if crash:
        backend = LogBackend(segment_bytes=1 << 20, index_interval_bytes=256)  # no close: a kill
    else:
        backend.close()
        backend = LogBackend(segment_bytes=1 << 20, index_interval_bytes=256)
    backend.open(root)
    stream = backend.open_stream("/", "orders")
    assert stream.durable_end == 140
    _check_format1_records(stream)
    new = stream.read_many(40, 140, 1000)
    assert [r.message.body for r in new] == [b"new-%03d" % n for n in range(40, 140)]
    # The old segments' bytes are as they were; the new records went in as batches.
    for name, raw in before.items():
        assert (directory / name).read_bytes().startswith(raw)
    frames = _frames(directory)
    assert [offset for offset, batch in frames if not batch] == list(range(40))
    assert [offset for offset, batch in frames if batch] == [40, 50, 75, 100, 125]
    assert stream.offset_for_timestamp(T0 + 1110) == 110  # inside a batch
    backend.close()


def test_a_torn_batch_is_lost_whole_at_recovery(tmp_path: Path) -> None:
    """A crash in the middle of writing a batch: recovery cuts the log before it, and the
    batch's records (never confirmed: no flush covered them) are gone together."""
    backend = LogBackend(segment_bytes=1 << 20, index_interval_bytes=256)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    assert isinstance(stream, LogStream)
    for n in range(30):
        stream.append(Message("", "k", b"\x00\x00", b"first-%d" % n, timestamp_ms=T0))
    flush(backend)
    for n in range(30):
        stream.append(Message("", "k", b"\x00\x00", b"second-%d" % n, timestamp_ms=T0))
    stream.seal()
    stream.log.write_out()
    (segment,) = tmp_path.glob("log/*/*.log")
    size = segment.stat().st_size
    with open(segment, "r+b") as file:
        file.truncate(size - 100)  # the end of the second batch never reached the disk
    backend = LogBackend(segment_bytes=1 << 20, index_interval_bytes=256)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    assert stream.next_offset == 30
    assert [r.message.body for r in stream.read_many(0, 30, 100)] == [
        b"first-%d" % n for n in range(30)
    ]
    stream.append(Message("", "k", b"\x00\x00", b"after", timestamp_ms=T0))
    flush(backend)
    assert stream.read(30).message.body == b"after"  # type: ignore[union-attr]
    backend.close()


def test_a_batch_the_log_cannot_take_stays_open_and_keeps_its_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors when a batch needs a new segment: the publish that would have
    overflowed is refused, the open batch keeps its records and offsets, and the next flush
    writes them (nothing lost, no offset given twice)."""
    backend = LogBackend(segment_bytes=4096, index_interval_bytes=256)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    assert isinstance(stream, LogStream)
    for n in range(30):  # the first segment: ~1.6 KiB
        stream.append(Message("", "k", b"\x00\x00", b"a%02d" % n + b"." * 50, timestamp_ms=T0))
    flush(backend)
    real_roll = Log._roll

    def no_descriptors(self: Log, base_offset: int) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(Log, "_roll", no_descriptors)
    offsets: list[int] = []

    def fill() -> None:
        for n in range(200):
            body = b"b%03d" % n + b"." * 50
            offsets.append(stream.append(Message("", "k", b"\x00\x00", body, timestamp_ms=T0)))

    with pytest.raises(OSError, match="Too many open files"):
        fill()
    assert offsets == list(range(30, 30 + len(offsets)))
    assert stream.next_offset == 30 + len(offsets)  # the refused publish took no offset
    monkeypatch.setattr(Log, "_roll", real_roll)
    flush(backend)
    assert stream.durable_end == 30 + len(offsets)
    bodies = [r.message.body[:4] for r in stream.read_many(30, stream.durable_end, 1000)]
    assert bodies == [b"b%03d" % n for n in range(len(offsets))]
    backend.close()


def test_a_run_the_log_cannot_take_whole_is_taken_up_to_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``append_many`` of a run that outgrows the segment when no new one can be made: the
    records before the refusal are in the open batch with their offsets, the refusal is
    returned (the publish path nacks that one), and the next flush writes them."""
    backend = LogBackend(segment_bytes=4096, index_interval_bytes=256)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    assert isinstance(stream, LogStream)
    assert stream.append_many([]) == (0, None)
    small = [Message("", "k", b"\x00\x00", b"a%02d" % n, timestamp_ms=T0) for n in range(3)]
    assert stream.append_many(small) == (3, None)  # fits: added at once
    flush(backend)

    def no_descriptors(self: Log, base_offset: int) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    real_roll = Log._roll
    monkeypatch.setattr(Log, "_roll", no_descriptors)
    run = [
        Message("", "k", b"\x00\x00", b"b%03d" % n + b"." * 50, timestamp_ms=T0) for n in range(200)
    ]
    taken, error = stream.append_many(run)
    assert isinstance(error, OSError)
    assert error.errno == errno.EMFILE
    assert 0 < taken < len(run)
    assert stream.next_offset == 3 + taken  # the refused record took no offset
    monkeypatch.setattr(Log, "_roll", real_roll)
    flush(backend)
    assert stream.durable_end == 3 + taken
    bodies = [r.message.body[:4] for r in stream.read_many(0, stream.durable_end, 1000)]
    assert bodies == [b"a%02d" % n for n in range(3)] + [b"b%03d" % n for n in range(taken)]
    backend.close()


@pytest.mark.parametrize("first", ["a-full-batch", "one-big-message"])
async def test_a_publish_after_a_flush_began_never_rides_its_ticket(
    tmp_path: Path, first: str
) -> None:
    """The ticket of a batch that an append sealed (it filled up) is covered by the next
    flush; a publish made while that flush runs goes into a new batch, which that flush does
    not write: it must wait for a later ticket (it was acked before the fsync once)."""
    backend = LogBackend(segment_bytes=8 << 20)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    flusher = Flusher(backend)
    queue = StreamQueue(
        "/",
        "s",
        stream,
        host=None,  # type: ignore[arg-type]
        backend_name="log",
        arguments=QueueArguments.parse({"x-queue-type": "stream"}),
        flusher=flusher,
    )
    if first == "a-full-batch":
        for n in range(MAX_BATCH_RECORDS):  # the last append seals the batch it fills
            queue.publish(Message("", "k", b"\x00\x00", b"%d" % n, timestamp_ms=T0))
    else:
        queue.publish(Message("", "k", b"\x00\x00", b"x" * MAX_BATCH_BYTES, timestamp_ms=T0))
    covering = flusher.requested  # what Flusher.run does: the flush covers what was asked...
    work = backend.begin_flush()  # ... and begins
    late = queue.publish(Message("", "k", b"\x00\x00", b"late", timestamp_ms=T0))
    assert work is not None
    work()
    flusher.completed = covering  # the flush is over
    assert late is not None
    _commit, ticket = late
    assert ticket > flusher.completed, "confirmed before the flush that writes it"
    assert stream.durable_end == stream.next_offset - 1  # the late record: not durable yet
    backend.close()


def test_a_record_that_would_take_a_batch_past_its_size_goes_in_a_frame_of_its_own(
    tmp_path: Path,
) -> None:
    """Batches stay within ``MAX_BATCH_BYTES`` unless one record is bigger, which is then a
    frame alone: a batch is never a near-full batch plus a big message (with the largest
    messages the broker takes, such a frame would be longer than any a reader accepts)."""
    backend = LogBackend(segment_bytes=64 << 20, index_interval_bytes=256)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    small = [Message("", "k", b"", b"s" * 100_000) for _ in range(9)]  # ~900 kB
    big = Message("", "k", b"", b"B" * 1_200_000)
    assert stream.append_many([*small, big, *small]) == (19, None)
    flush(backend)
    (directory,) = tmp_path.glob("log/*")
    assert _frames(directory) == [(0, True), (9, False), (10, True)]  # the big one alone
    assert [r.message.body[:1] for r in stream.read_many(0, 19, 100)] == [b"s"] * 9 + [b"B"] + [
        b"s"
    ] * 9
    backend.close()
