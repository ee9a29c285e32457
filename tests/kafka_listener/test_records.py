"""Kafka's record batch (``tqbroker.protocol.kafka.records``) against kafka-python's builder
and reader (``kafka.record``): what kafka-python builds we read record for record, and what we
write kafka-python reads back with a valid CRC. A damaged byte anywhere is ``CorruptBatch``
(Kafka answers CORRUPT_MESSAGE, ``UnifiedLog.scala``: a batch whose CRC fails)."""

from __future__ import annotations

from typing import Any

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from tqbroker.protocol.kafka.records import (
    CorruptBatch,
    Header,
    InvalidRecord,
    RecordBatch,
    RecordTooLarge,
    UnsupportedCompression,
    UnsupportedMagic,
    batch_of,
    check_batch,
    decode_batch,
    decode_batches,
    encode_batch,
)

headers = st.lists(
    st.builds(Header, st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=3
)
records = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=10),
        st.none() | st.binary(max_size=30),
        headers,
        st.integers(0, 2**41),
    ),
    min_size=1,
    max_size=8,
)


def kafka_python_batch(base_offset: int, drawn: list[Any], producer: tuple[int, int, int]) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
        batch_size=1 << 20,
    )
    for n, (key, value, hs, timestamp) in enumerate(drawn):
        builder.append(n, timestamp, key, value, [(h.key, h.value) for h in hs])
    data = bytearray(builder.build())
    data[0:8] = base_offset.to_bytes(8, "big", signed=True)
    return bytes(data)


@settings(max_examples=200, deadline=None)
@given(records, st.integers(0, 2**40), st.sampled_from([(-1, -1, -1), (7, 2, 100)]))
def test_we_read_what_kafka_python_builds(drawn: list[Any], base: int, producer: Any) -> None:
    (batch,) = decode_batches(kafka_python_batch(base, drawn, producer))
    assert batch.base_offset == base
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == producer
    assert batch.max_timestamp == max(t for *_, t in drawn)
    assert batch.next_offset == base + len(drawn)
    got = [
        (r.key, r.value, list(r.headers), batch.base_timestamp + r.timestamp_delta)
        for r in batch.records
    ]
    assert got == [(k, v, list(h), t) for k, v, h, t in drawn]
    assert [r.offset_delta for r in batch.records] == list(range(len(drawn)))


@settings(max_examples=200, deadline=None)
@given(records, st.integers(0, 2**40))
def test_kafka_python_reads_what_we_write(drawn: list[Any], base: int) -> None:
    data = encode_batch(batch_of(drawn, base))
    theirs = MemoryRecords(data).next_batch()
    assert theirs.validate_crc()
    assert theirs.base_offset == base
    got = [(r.key, r.value, list(r.headers), r.timestamp, r.offset) for r in theirs]
    expected = [
        (k, v, [(h.key, h.value) for h in hs], t, base + n) for n, (k, v, hs, t) in enumerate(drawn)
    ]
    assert got == expected
    assert decode_batch(data) == batch_of(drawn, base)._replace(last_offset_delta=len(drawn) - 1)


@settings(max_examples=200, deadline=None)
@given(records, st.data())
def test_a_damaged_byte_is_a_corrupt_batch(drawn: list[Any], data: st.DataObject) -> None:
    raw = bytearray(encode_batch(batch_of(drawn, 0)))
    at = data.draw(st.integers(17, len(raw) - 1))  # past the magic: the CRC covers it all
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptBatch):
        decode_batch(bytes(raw))
    with pytest.raises(CorruptBatch):
        check_batch(bytes(raw), max_value=1 << 20)


@settings(max_examples=300, deadline=None)
@given(records, st.integers(0, 2**40), st.integers(0, 12), st.integers(0, 30))
def test_a_produce_check_agrees_with_the_decoder(
    drawn: list[Any], base: int, max_name: int, max_value: int
) -> None:
    """``check_batch`` (a produce's walk, building nothing) takes what ``decode_batch``
    decodes, refusing exactly the keys and header names over ``max_name`` bytes or not UTF-8
    and the values over ``max_value``; its header is the decoded batch's."""
    raw = kafka_python_batch(base, drawn, (7, 2, 100))
    batch = decode_batch(raw)
    names = [r.key or b"" for r in batch.records] + [
        h.key.encode() for r in batch.records for h in r.headers
    ]

    def text(name: bytes) -> bool:
        try:
            name.decode()
        except UnicodeDecodeError:
            return False
        return True

    bad_name = any(len(n) > max_name or not text(n) for n in names)
    too_large = any(len(r.value or b"") > max_value for r in batch.records)
    try:
        header = check_batch(raw, max_value=max_value, max_name=max_name)
    except InvalidRecord:
        assert bad_name
    except RecordTooLarge:
        assert too_large
    else:
        assert not bad_name
        assert not too_large
        assert header.record_count == len(batch.records)
        assert header.max_timestamp == batch.max_timestamp
        assert (header.producer_id, header.base_sequence) == (7, 100)


def test_several_batches_and_a_trailing_partial_one() -> None:
    """A Fetch response may end inside a batch (``max_bytes``): the whole ones are read."""
    one = encode_batch(batch_of([(b"k", b"v", [], 5)], 0))
    two = encode_batch(batch_of([(None, b"w", [], 6), (b"k", None, [], 7)], 1))
    batches = decode_batches(one + two + two[:30])
    assert [b.base_offset for b in batches] == [0, 1]
    assert [len(b.records) for b in batches] == [1, 2]


def test_old_magic_and_unknown_codecs_are_refused_by_name() -> None:
    data = bytearray(encode_batch(batch_of([(b"k", b"v", [], 5)], 0)))
    old = bytes(data[:16]) + b"\x01" + bytes(data[17:])
    with pytest.raises(UnsupportedMagic):
        decode_batches(old)
    with pytest.raises(UnsupportedCompression):
        encode_batch(RecordBatch(0, (), 0, 0, attributes=5))
    unknown = bytearray(encode_batch(batch_of([(b"k", b"v", [], 5)], 0)))
    unknown[22] |= 5  # attributes' low byte: codec 5, which Kafka has not
    unknown[17:21] = google_crc32c.value(bytes(unknown[21:])).to_bytes(4, "big")
    with pytest.raises(UnsupportedCompression):
        decode_batches(bytes(unknown))


CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_batches_both_ways_with_kafka_python(codec: str) -> None:
    """kafka-python's codecs (python-snappy's xerial framing, lz4's frames, zstandard) against
    ours (cramjam): what it compresses we read, what we compress it reads."""
    drawn = [(b"k%d" % n, b"value %d " % n * 40, [Header("h", b"x")], 1000 + n) for n in range(50)]
    builder = DefaultRecordBatchBuilder(2, CODECS[codec], False, 7, 1, 0, 1 << 20)
    for n, (key, value, hs, timestamp) in enumerate(drawn):
        builder.append(n, timestamp, key, value, [(h.key, h.value) for h in hs])
    theirs = bytes(builder.build())
    batch = decode_batch(theirs)
    assert batch.compression == CODECS[codec]
    assert [(r.key, r.value) for r in batch.records] == [(k, v) for k, v, _h, _t in drawn]
    ours = encode_batch(batch._replace(base_offset=9))
    assert len(ours) < sum(len(v) for _k, v, _h, _t in drawn)  # compressed
    (read,) = list(_kafka_python_batches(ours))
    assert [(r.key, r.value, r.offset) for r in read] == [
        (k, v, 9 + n) for n, (k, v, _h, _t) in enumerate(drawn)
    ]


def _kafka_python_batches(data: bytes) -> Any:
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        yield batch
