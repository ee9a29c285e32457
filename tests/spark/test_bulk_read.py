"""The broker's side of the bulk read that Spark fetches (``broker/streams/bulk_read.py``) and
the executors' read-ahead (``read_range``), without Spark: records walked segment by segment
still have their damage reported, bodies built from pieces equal ``encode_read``'s, reads cut
into many slices and many requests return every record once, in order, and a read that
retention cuts into stops where the gap begins."""

from __future__ import annotations

import types
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.format import (
    BATCH_COUNT,
    FLAG_BATCH,
    RECORD_FIXED,
    RECORD_HEAD,
    encode_record,
)
from tqbroker.backends.streams import CorruptLogError
from tqbroker.broker.streams import bulk_read
from tqbroker.broker.streams.partition import Partition
from tqbroker.model import Message
from tqbroker.recordbatch import (
    BinaryColumn,
    ReadBatch,
    decode_read,
    encode_frames,
    encode_read,
    encode_read_parts,
)
from tqbroker.spark._arrow_read import decode_fetch, read_schema
from tqbroker.spark._options import source_options
from tqbroker.spark._source import TopicRange, read_range

if TYPE_CHECKING:
    from .conftest import Topics


async def frames_body(
    vhost: Any, topic: str, index: int, *, offset: int, end: int | None, max_bytes: int
) -> bytes:
    """``bulk_read.plan_frames``'s ``TQF1`` body, each piece built in turn, whole."""
    plan = await bulk_read.plan_frames(
        vhost, topic, index, offset=offset, end=end, max_bytes=max_bytes
    )
    return b"".join([await piece.build() for piece in plan.pieces()])


@settings(deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=9), st.binary(max_size=5), st.binary(max_size=7))),
    st.booleans(),
    st.integers(0, 1 << 40),
)
def test_bodies_from_pieces_equal_read_batches(
    records: list[tuple[bytes, bytes, bytes]], headers: bool, start: int
) -> None:
    n = len(records)
    offsets, stamps = array("q", range(start, start + n)), array("q", [7] * n)
    keys, values, heads = ([r[i] for r in records] for i in range(3))
    batch = ReadBatch(
        start + n,
        offsets,
        stamps,
        BinaryColumn.of(keys),
        BinaryColumn.of(values),
        BinaryColumn.of(heads) if headers else None,
    )
    columns = [(map(len, keys), [b"".join(keys)]), (map(len, values), values)]
    if headers:
        columns.append((map(len, heads), heads))
    assert encode_read_parts(start + n, offsets, stamps, columns) == encode_read(batch)


def test_a_damaged_record_fails_the_bulk_read(tmp_path: Path) -> None:
    """Strict reads: a bulk read meeting a damaged frame below the high watermark raises (the
    stream service answers 503) rather than stepping over it, and the stream is failed."""
    backend = LogBackend(segment_bytes=8192, index_interval_bytes=512)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    for i in range(300):
        stream.append(Message("", f"k{i % 7}", b"", b"body-%04d" % i + b"." * 40))
        stream.seal()  # records of their own
    work = backend.begin_flush()
    assert work is not None
    work()
    victim = next(
        p for p in sorted(stream.directory.glob("*.log")) if b"body-0150" in p.read_bytes()
    )
    data = bytearray(victim.read_bytes())
    data[data.index(b"body-0150") + 2] ^= 1
    victim.write_bytes(bytes(data))
    columns = bulk_read._Columns(headers=False)
    with pytest.MonkeyPatch.context() as patch:  # one slice, however busy the machine
        patch.setattr(bulk_read, "SLICE_SECONDS", 60.0)
        with pytest.raises(CorruptLogError):
            columns.take(Partition(stream, None), 3, 300, 1 << 20)
    assert stream.failure is not None
    backend.close()


def test_reads_cut_in_slices_and_requests_return_each_record_once(
    topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames taken a chunk at a time (the broker gives way after each) and requests of a
    frame or two (the executor asks for the next one before it hands this one to Spark); a
    reader that stops early leaves the next read unharmed."""
    monkeypatch.setattr(bulk_read, "FRAMES_CHUNK", 1000)  # the broker runs in this process
    topics.create("slices", 1)
    for first in range(0, 1500, 25):  # a record batch each (~3 kB)
        topics.produce(
            "slices", [{"value": f"{i:05d}" + "v" * 95} for i in range(first, first + 25)]
        )
    options = source_options(
        {"tqbroker.url": topics.url, "subscribe": "slices", "fetchMaxBytes": "4000"},
        streaming=False,
    )
    part = TopicRange("slices", 0, 0, 1500)
    early = read_range(options, part)
    assert next(early).num_rows > 0
    early.close()  # the request sent ahead is still on its way
    batches = list(read_range(options, TopicRange("slices", 0, 7, 1500)))
    assert len(batches) >= 25  # ~2 frames a request
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(7, 1500))
    values = [v[:5] for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"%05d" % o for o in offsets]
    one = {"tqbroker.url": topics.url, "subscribe": "slices", "fetchMaxBytes": "1000000"}
    (whole,) = read_range(source_options(one, streaming=False), part)  # 1 request
    assert whole.column("offset").to_pylist() == list(range(1500))


class _Retention:
    """A log backend's stream whose retention removes offsets below 600 once the first bulk
    read has been made (so, during the read's first pause)."""

    def __init__(self, stream: Any) -> None:
        self.inner = stream
        self.durable_end = stream.durable_end
        self.reads = 0

    @property
    def first_offset(self) -> int:
        return 600 if self.reads else 0

    def read_many(self, offset: int, end: int, limit: int) -> list[Any]:
        records = list(self.inner.read_many(max(offset, self.first_offset), end, limit))
        self.reads += 1
        return records

    def read_from(self, offset: int) -> Any:
        return self.inner.read_from(max(offset, self.first_offset))

    def read_frames(self, offset: int, end: int, max_bytes: int) -> Any:
        found = self.inner.read_frames(max(offset, self.first_offset), end, max_bytes)
        self.reads += 1
        return found


def test_a_read_stops_where_retention_cut_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gap that retention makes while a read pauses ends the batch: the reader's next fetch
    starts there, and sees the gap at its start (where ``read_range`` checks for data loss)."""
    backend = LogBackend()
    backend.open(tmp_path)
    inner = backend.open_stream("/", "s")
    for i in range(1000):
        inner.append(Message("", "k", b"", b"%04d" % i))
    work = backend.begin_flush()
    assert work is not None
    work()
    retention = _Retention(inner)
    partition = Partition(retention, None)  # type: ignore[arg-type]  # the reads a bulk read makes
    queue = types.SimpleNamespace(partition=partition, compaction=None)
    monkeypatch.setattr(bulk_read, "SLICE_SECONDS", 0.0)
    monkeypatch.setattr(bulk_read, "partition", lambda *_args: queue)

    async def read(offset: int) -> ReadBatch:
        body = await bulk_read.read_body(
            None,  # type: ignore[arg-type]
            "t",
            0,
            offset=offset,
            end=None,
            max_bytes=1 << 20,
            headers=False,
        )
        return decode_read(body, headers=False)

    first = trio.run(read, 0)
    assert list(first.offsets) == list(range(256))
    assert first.next_offset == 256
    after = trio.run(read, first.next_offset)
    assert after.offsets[0] == 600

    # The same with frames: the read gives way after its first chunk (a batch of 1000
    # records is more than a chunk of 1 byte), and stops there.
    monkeypatch.setattr(bulk_read, "FRAMES_CHUNK", 1)
    retention.reads = 0

    async def read_frames(offset: int) -> Any:
        body = await frames_body(
            None,
            "t",
            0,
            offset=offset,
            end=None,
            max_bytes=1 << 20,
        )
        return decode_fetch(body, "t", 0, include_headers=False, start=offset)

    first_frames = trio.run(read_frames, 0)
    assert first_frames.offsets.tolist() == list(range(1000))  # one frame: the batch
    assert first_frames.next_offset == 1000


@settings(max_examples=40, deadline=None)
@given(
    runs=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["", "k", "clé-ü"]), st.binary(max_size=60)),
            min_size=1,
            max_size=30,
        ),
        min_size=1,
        max_size=8,
    ),
    data=st.data(),
)
def test_frames_and_columns_give_the_same_arrow_batches(
    tmp_path_factory: Any, runs: list[list[tuple[str, bytes]]], data: st.DataObject
) -> None:
    """The executors decode a ``TQF1`` body (the log's frames, records outside the range
    included) into the batch a ``TQR1`` body (columns the broker built) gives."""
    backend = LogBackend(segment_bytes=2000, index_interval_bytes=128)
    backend.open(tmp_path_factory.mktemp("frames"))
    stream = backend.open_stream("/", "s")
    for run in runs:  # a frame each: a batch, or a record alone
        stream.append_many([Message("", key, b"", body) for key, body in run])
        stream.seal()
    work = backend.begin_flush()
    assert work is not None
    work()
    total = stream.durable_end
    start = data.draw(st.integers(0, total))
    end = data.draw(st.integers(start, total + 1))
    max_bytes = data.draw(st.integers(1, 3000))
    queue = types.SimpleNamespace(partition=Partition(stream, None), compaction=None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bulk_read, "partition", lambda *_args: queue)

        async def read_all(frames: bool) -> pa.Table:
            batches, position = [], start
            while position < end:
                if frames:
                    body = await frames_body(
                        None,  # the partition is patched in
                        "t",
                        0,
                        offset=position,
                        end=end,
                        max_bytes=max_bytes,
                    )
                else:
                    body = await bulk_read.read_body(
                        None,  # type: ignore[arg-type]  # the partition is patched in
                        "t",
                        0,
                        offset=position,
                        end=end,
                        max_bytes=max_bytes,
                        headers=False,
                    )
                fetched = decode_fetch(body, "t", 0, include_headers=False, start=position, end=end)
                batches.append(fetched.batch)
                if fetched.next_offset <= position:
                    break
                position = fetched.next_offset
            return pa.Table.from_batches(batches, schema=read_schema(False))

        from_frames = trio.run(read_all, True)
        from_columns = trio.run(read_all, False)
    assert from_frames.equals(from_columns)
    assert from_frames.column("offset").to_pylist() == list(range(start, min(end, total)))
    backend.close()


def test_malformed_frame_bodies_are_refused(tmp_path: Path) -> None:
    backend = LogBackend()
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    stream.append_many([Message("", "k", b"", b"v%d" % i) for i in range(5)])
    stream.seal()
    stream.append(Message("", "k", b"", b"alone"))
    work = backend.begin_flush()
    assert work is not None
    work()
    frames, next_offset = stream.read_frames(0, 6, 1 << 20)
    body = encode_frames(next_offset, frames)
    whole = decode_fetch(body, "t", 0, include_headers=False)
    assert whole.offsets.tolist() == list(range(6))
    assert whole.batch.column("value").to_pylist()[-1] == b"alone"
    for cut in (20, 40, len(body) - 1):
        with pytest.raises(ValueError, match="TQF1"):
            decode_fetch(body[:cut], "t", 0, include_headers=False)
    with pytest.raises(ValueError, match="TQF1"):
        decode_fetch(body + b"\0", "t", 0, include_headers=False)
    bent = bytearray(body)
    bent[16 + 4 + 4 + 8 + 8 + 1 + 4 + 3] = 0xFF  # the first entry's length: past the batch
    with pytest.raises(ValueError, match="TQF1"):
        decode_fetch(bytes(bent), "t", 0, include_headers=False)
    record = encode_record(7, 1_700_000_000_000, 0, Message("", "k", b"", b"v"))
    empty_batch = RECORD_FIXED.pack(8, 0, FLAG_BATCH) + BATCH_COUNT.pack(0)
    for frames_given in (
        [(record[:8], record[8:]), (RECORD_HEAD.pack(len(empty_batch) + 4, 0), empty_batch)],
        [_split(encode_record(2**63, 0, 0, Message("", "k", b"", b"v")))],  # past int64
        [_split(encode_record(2**63 - 1, 0, 0, Message("", "k", b"", b"v"))), _split(record)],
        [_split(encode_record(7, 2**64 - 1, 0, Message("", "k", b"", b"v")))],  # timestamp
    ):
        with pytest.raises(ValueError, match="TQF1"):
            decode_fetch(encode_frames(9, frames_given), "t", 0, include_headers=False)
    backend.close()


def _split(frame: bytes) -> tuple[bytes, bytes]:
    return frame[:8], frame[8:]
