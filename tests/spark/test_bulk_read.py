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

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tqbroker.backends.log import LogBackend
from tqbroker.broker.streams import bulk_read
from tqbroker.model import Message
from tqbroker.recordbatch import (
    BinaryColumn,
    ReadBatch,
    decode_read,
    encode_read,
    encode_read_parts,
)
from tqbroker.spark._options import source_options
from tqbroker.spark._source import TopicRange, read_range

if TYPE_CHECKING:
    from conftest import Topics


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


def test_a_damaged_record_is_stepped_over_and_reported(tmp_path: Path) -> None:
    backend = LogBackend(segment_bytes=8192, index_interval_bytes=512)
    backend.open(tmp_path)
    stream = backend.open_stream("/", "s")
    for i in range(300):
        stream.append(Message("", f"k{i % 7}", b"", b"body-%04d" % i + b"." * 40))
        stream.seal()  # records of their own (a damaged batch is lost whole)
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
    assert columns.take(stream, 3, 300, 1 << 20) == 300
    assert list(columns.offsets) == [o for o in range(3, 300) if o != 150]
    assert bytes(columns.values[-1]).startswith(b"body-0299")
    assert stream.log.corrupt_records == 1  # as a read record by record reports it


def test_reads_cut_in_slices_and_requests_return_each_record_once(
    topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices of 256 records (the broker gives way after each) and requests of ~40 records
    (the executor asks for the next one before it hands this one to Spark); a reader that
    stops early leaves the next read unharmed."""
    monkeypatch.setattr(bulk_read, "SLICE_SECONDS", 0.0)  # the broker runs in this process
    topics.create("slices", 1)
    topics.produce("slices", [{"value": f"{i:05d}" + "v" * 95} for i in range(1500)])
    options = source_options(
        {"tqbroker.url": topics.url, "subscribe": "slices", "fetchMaxBytes": "4000"},
        streaming=False,
    )
    part = TopicRange("slices", 0, 0, 1500)
    early = read_range(options, part)
    assert next(early).num_rows > 0
    early.close()  # the request sent ahead is still on its way
    batches = list(read_range(options, TopicRange("slices", 0, 7, 1500)))
    assert len(batches) > 30
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(7, 1500))
    values = [v[:5] for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"%05d" % o for o in offsets]
    one = {"tqbroker.url": topics.url, "subscribe": "slices", "fetchMaxBytes": "1000000"}
    (whole,) = read_range(source_options(one, streaming=False), part)  # 6 slices, 1 request
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
    queue = types.SimpleNamespace(stream=_Retention(inner), compaction=None)
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
