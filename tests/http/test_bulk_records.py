"""The columnar bulk endpoints (``recordbatch.py`` formats) over a real socket, and the formats'
round trip as a property."""

from __future__ import annotations

import json
import struct
from array import array
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tqbroker_partitioner import partition_for

from tqbroker.backends.log.format import Batch, decode_frame
from tqbroker.recordbatch import (
    BinaryColumn,
    ReadBatch,
    WriteBatch,
    decode_read,
    decode_write,
    encode_read,
    encode_write,
)

pytestmark = pytest.mark.timeout(60)

blobs = st.lists(st.binary(max_size=40), max_size=20)


@given(blobs, st.booleans(), st.integers(min_value=0, max_value=2**40))
def test_read_batches_round_trip(values: list[bytes], headers: bool, start: int) -> None:
    n = len(values)
    batch = ReadBatch(
        start + n,
        array("q", range(start, start + n)),
        array("q", [1_700_000_000_000 + i for i in range(n)]),
        BinaryColumn.of([b"k%d" % i for i in range(n)]),
        BinaryColumn.of(values),
        BinaryColumn.of([b"{}"] * n) if headers else None,
    )
    assert decode_read(encode_read(batch), headers=headers) == batch


@given(blobs)
def test_write_batches_round_trip_and_truncations_are_refused(values: list[bytes]) -> None:
    n = len(values)
    batch = WriteBatch(
        array("i", [-1] * n),
        BinaryColumn.of([b"k"] * n),
        BinaryColumn.of(values),
        BinaryColumn.of([b""] * n),
    )
    body = encode_write(batch)
    assert decode_write(body) == batch
    for cut in range(len(body)):
        with pytest.raises(ValueError, match=r"TQW1|ends inside"):
            decode_write(body[:cut])


def write_body(
    values: list[bytes], keys: list[bytes], partitions: list[int], headers: list[bytes]
) -> bytes:
    return encode_write(
        WriteBatch(
            array("i", partitions),
            BinaryColumn.of(keys),
            BinaryColumn.of(values),
            BinaryColumn.of(headers),
        )
    )


def read(http: httpx.Client, topic: str, partition: int, **params: Any) -> ReadBatch:
    response = http.get(f"/topics/{topic}/partitions/{partition}/records", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-tqbroker-records"
    return decode_read(response.content, headers=params.get("headers") == "true")


def test_bulk_write_routes_by_key_and_bulk_read_returns_columns(http: httpx.Client) -> None:
    assert http.put("/topics/bulk", json={"partitions": 3}).status_code == 201
    keys = [b"user-%d" % (n % 7) for n in range(60)]
    values = [b"v%d" % n for n in range(60)]
    body = write_body(values, keys, [-1] * 59 + [2], [b""] * 59 + [b'{"trace": "t"}'])
    response = http.post("/topics/bulk/records", content=body)
    assert response.status_code == 201
    assert response.json() == {"count": 60, "skipped": 0}
    got: dict[int, ReadBatch] = {p: read(http, "bulk", p, headers="true") for p in range(3)}
    for n in range(59):  # keyed records went where the partitioner sends them, in order
        batch = got[partition_for(keys[n], 3)]
        assert values[n] in [batch.values[i] for i in range(len(batch))]
    last = got[2]
    assert last.values[len(last) - 1] == b"v59"  # the explicit partition
    assert json.loads(last.headers[len(last) - 1]) == {"trace": "t"}  # type: ignore[index]
    for p, batch in got.items():
        assert list(batch.offsets) == list(range(len(batch)))
        assert batch.next_offset == len(batch)
        assert all(t > 0 for t in batch.timestamps_ms)
        order = [int(batch.values[i][1:]) for i in range(len(batch))]
        assert order == sorted(order), p


def test_ranges_and_byte_budget(http: httpx.Client) -> None:
    http.put("/topics/ranged", json={"partitions": 1})
    body = write_body([b"x" * 1000] * 50, [b""] * 50, [0] * 50, [b""] * 50)
    assert http.post("/topics/ranged/records", content=body).status_code == 201
    middle = read(http, "ranged", 0, offset=10, end=20)
    assert list(middle.offsets) == list(range(10, 20))
    assert middle.next_offset == 20
    small = read(http, "ranged", 0, offset=0, max_bytes=3500)
    assert len(small) == 4  # stops once 3,500 bytes of values are in (at least one)
    past = read(http, "ranged", 0, offset=50)
    assert len(past) == 0
    assert past.next_offset == 50


def test_frames_are_served_as_they_lie_in_the_log(http: httpx.Client) -> None:
    """``format=frames``: the log's frames (a batch per bulk write here), CRCs and all; the
    first frame holds the records below ``offset`` too, the reader skips them."""
    http.put("/topics/framed", json={"partitions": 1})
    for first in (0, 30):
        values = [b"v%d" % n for n in range(first, first + 30)]
        body = write_body(values, [b"k"] * 30, [0] * 30, [b""] * 30)
        assert http.post("/topics/framed/records", content=body).status_code == 201
    path = "/topics/framed/partitions/0/records"
    response = http.get(path, params={"format": "frames", "offset": 10, "max_bytes": 1})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-tqbroker-frames"
    raw = response.content
    magic, count, next_offset = struct.unpack_from("<4sIq", raw)
    assert (magic, count, next_offset) == (b"TQF1", 1, 30)  # one frame: the budget is spent
    frame = decode_frame(raw, 16)  # checks the CRC
    assert isinstance(frame, Batch)
    assert [r.offset for r in frame.records] == list(range(30))
    assert frame.records[10].message.body == b"v10"
    whole = http.get(path, params={"format": "frames", "offset": 10, "end": 45}).content
    assert struct.unpack_from("<4sIq", whole) == (b"TQF1", 2, 45)
    for params in ({"format": "arrow"}, {"format": "frames", "headers": "true"}):
        refused = http.get(path, params=params)
        assert refused.status_code == 400
        assert "format" in refused.json()["message"] or "headers" in refused.json()["message"]


def test_idempotent_producer_writes_each_sequence_once_however_it_is_cut(
    http: httpx.Client,
) -> None:
    http.put("/topics/once", json={"partitions": 2})

    def post(values: list[bytes], first: int) -> httpx.Response:
        body = write_body(values, [b"k"] * len(values), [-1] * len(values), [b""] * len(values))
        headers = {"x-producer-id": "query-1/task-0", "x-producer-sequence": str(first)}
        return http.post("/topics/once/records", content=body, headers=headers)

    assert post([b"r7", b"r8"], 7).json() == {"count": 2, "skipped": 0}  # records 7 and 8
    again = post([b"r7", b"r8"], 7)  # a retry
    assert again.status_code == 200
    assert again.json()["duplicate"]
    # A replay cut differently: 6..9 — 7 and 8 are skipped, 6 is older (skipped), 9 is new.
    assert post([b"r6", b"r7", b"r8", b"r9"], 6).json() == {"count": 1, "skipped": 3}
    assert post([b"r10"], 10).status_code == 201
    values = sorted(v for p in range(2) for v in read_values(http, "once", p))
    assert values == [b"r10", b"r7", b"r8", b"r9"]


def read_values(http: httpx.Client, topic: str, partition: int) -> list[bytes]:
    batch = read(http, topic, partition)
    return [batch.values[i] for i in range(len(batch))]


def test_bad_bulk_requests(http: httpx.Client) -> None:
    http.put("/topics/badbulk", json={"partitions": 1})
    for body, words in (
        (b"nope", "TQW1"),
        (write_body([b"a"], [b"k"], [0], [b""])[:-1], "TQW1"),
        (write_body([b"a"], [b"k"], [0], [b"{bad json"]), "record 0"),
        (write_body([b"a"], [b"\xff"], [0], [b""]), "record 0"),
        (write_body([b"a"], [b"k"], [5], [b""]), "partitions 0..0"),
    ):
        response = http.post("/topics/badbulk/records", content=body)
        assert response.status_code in (400, 404), response.text
        assert words in response.json()["message"]
    no_sequence = http.post(
        "/topics/badbulk/records",
        content=write_body([b"a"], [b"k"], [0], [b""]),
        headers={"x-producer-id": "p"},
    )
    assert no_sequence.status_code == 400
    assert http.get("/topics/badbulk/partitions/3/records").status_code == 404
    assert (
        http.get("/topics/badbulk/partitions/0/records", params={"max_bytes": 0}).status_code == 400
    )
    assert read(http, "badbulk", 0).next_offset == 0  # nothing was written
