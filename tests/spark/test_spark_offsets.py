"""The data source's pure parts without Spark: options and their errors, offset resolution,
the rate limit, data-loss checks, partition planning, and the Arrow conversions of the bulk
bodies."""

from __future__ import annotations

import json
from array import array
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.etcd import dead_endpoint
from tests.support.polling import eventually
from tqbroker.recordbatch import BinaryColumn, ReadBatch, decode_write, encode_read
from tqbroker.spark._arrow_read import decode_fetch, read_schema
from tqbroker.spark._arrow_write import encode_write
from tqbroker.spark._client import BrokerError, Client, PartitionInfo, client_for
from tqbroker.spark._offsets import (
    DataLossError,
    Range,
    from_json,
    ranges,
    rate_limit,
    resolve,
    split,
    to_json,
)
from tqbroker.spark._options import (
    OptionError,
    connection,
    sink_options,
    source_options,
)
from tqbroker.spark._source import TopicRange, read_range

if TYPE_CHECKING:
    from .conftest import Topics

BASE = {"subscribe": "t"}


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({}, False, "exactly one of the options 'subscribe'"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, False, "exactly one"),
        ({"subscribe": "a,,b"}, False, "option 'subscribe'"),
        ({"subscribePattern": "a.*"}, True, "'subscribePattern' is not supported"),
        ({"assign": "[0]"}, False, "option 'assign'"),
        ({**BASE, "startingOffsets": "latest"}, False, "cannot be 'latest' for a batch"),
        ({**BASE, "startingOffsets": "{nope"}, False, "option 'startingOffsets'"),
        ({**BASE, "startingOffsets": '{"t": {"0": -3}}'}, True, "option 'startingOffsets'"),
        ({**BASE, "startingOffsets": '{"t": {"0": -1}}'}, False, "-1 (latest) is not allowed"),
        ({**BASE, "startingOffsets": '{"t": {"x": 1}}'}, True, "not a partition number"),
        ({**BASE, "endingOffsets": '{"t": {"0": -2}}'}, False, "option 'endingOffsets'"),
        ({**BASE, "endingOffsets": "earliest"}, False, "option 'endingOffsets'"),
        ({**BASE, "endingOffsets": "latest"}, True, "batch queries only"),
        ({**BASE, "endingTimestamp": "5"}, True, "batch queries only"),
        ({**BASE, "startingTimestamp": "yesterday"}, True, "option 'startingTimestamp'"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, True, "option 'maxOffsetsPerTrigger'"),
        ({**BASE, "maxOffsetsPerTrigger": "10"}, False, "streaming queries only"),
        ({**BASE, "failOnDataLoss": "maybe"}, True, "option 'failOnDataLoss'"),
        ({**BASE, "includeHeaders": "1"}, True, "option 'includeHeaders'"),
        ({**BASE, "fetchMaxBytes": str(2**30)}, True, "option 'fetchMaxBytes'"),
        ({**BASE, "startingOffsetsByTimestampStrategy": "x"}, True, "Strategy"),
        ({**BASE, "minOffsetsPerTrigger": "5"}, True, "not supported"),
        ({**BASE, "tqbroker.url": "localhost:15672"}, True, "option 'tqbroker.url'"),
        ({**BASE, "tqbroker.url": "http://h:port"}, True, "option 'tqbroker.url'"),
        ({**BASE, "tqbroker.timeout": "-1"}, True, "option 'tqbroker.timeout'"),
        ({**BASE, "kafka.bootstrap.servers": "h:9092"}, True, "tqbroker.url"),
    ],
)
def test_bad_source_options_name_the_option(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        source_options(options, streaming=streaming)


def test_source_options_defaults_and_case_insensitivity() -> None:
    batch = source_options({"SUBSCRIBE": "a, b"}, streaming=False)
    assert batch.topics == ("a", "b")
    assert batch.starting.kind == "earliest"
    assert batch.ending is not None
    assert batch.ending.kind == "latest"
    assert batch.fail_on_data_loss
    assert not batch.include_headers
    assert batch.connection.url == "http://127.0.0.1:15672"
    stream = source_options({"subscribe": "a", "maxoffsetspertrigger": "7"}, streaming=True)
    assert stream.starting.kind == "latest"
    assert stream.max_offsets_per_trigger == 7
    # Kafka's precedence: startingTimestamp > startingOffsetsByTimestamp > startingOffsets.
    chosen = source_options(
        {
            "subscribe": "a",
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"a": {"0": 5}}',
            "startingTimestamp": "9",
        },
        streaming=True,
    )
    assert chosen.starting.kind == "timestamp"
    assert chosen.starting.timestamp == 9
    assert "secret" not in repr(connection({"tqbroker.password": "secret"}))


def test_bad_sink_options() -> None:
    with pytest.raises(OptionError, match="option 'topic'"):
        sink_options({"topic": " "})
    with pytest.raises(OptionError, match="option 'idempotent'"):
        sink_options({"idempotent": "yes"})
    assert sink_options({"topic": "t"}).idempotent


class FakeClient:
    """The two calls ``resolve`` makes, from fixed answers."""

    def __init__(self, by_timestamp: dict[int, dict[int, int | None]]) -> None:
        self.by_timestamp = by_timestamp

    def offsets_for_timestamp(self, topic: str, timestamp_ms: int) -> dict[int, int | None]:
        return self.by_timestamp[timestamp_ms]


INFOS = {
    ("t", 0): PartitionInfo("t", 0, 10, 100),
    ("t", 1): PartitionInfo("t", 1, 0, 50),
}


def spec(options: dict[str, str], *, streaming: bool = True) -> Any:
    return source_options({"subscribe": "t", **options}, streaming=streaming)


def test_resolve_offsets_timestamps_and_strategies() -> None:
    client: Any = FakeClient({5: {0: 20, 1: None}, 7: {0: 30, 1: 40}})
    opts = spec({"startingOffsets": '{"t": {"0": -2, "1": -1}}'})
    assert resolve(opts.starting, INFOS, client) == {("t", 0): 10, ("t", 1): 50}
    assert resolve(spec({}).starting, INFOS, client) == {("t", 0): 100, ("t", 1): 50}
    with pytest.raises(OptionError, match=r"every partition.*missing: t/1"):
        resolve(spec({"startingOffsets": '{"t": {"0": 1}}'}).starting, INFOS, client)
    with pytest.raises(OptionError, match=r"not read: t/7"):
        resolve(
            spec({"startingOffsets": '{"t": {"0": 1, "1": 1, "7": 1}}'}).starting, INFOS, client
        )
    with pytest.raises(OptionError, match="past the partition's end"):
        resolve(spec({"startingOffsets": '{"t": {"0": 101, "1": 1}}'}).starting, INFOS, client)
    timestamp = spec({"startingTimestamp": "5"}).starting
    with pytest.raises(OptionError, match="startingOffsetsByTimestampStrategy=latest"):
        resolve(timestamp, INFOS, client)
    assert resolve(timestamp, INFOS, client, strategy="latest") == {("t", 0): 20, ("t", 1): 50}
    assert resolve(timestamp, INFOS, client, ending=True) == {("t", 0): 20, ("t", 1): 50}
    by_timestamp = spec({"startingOffsetsByTimestamp": '{"t": {"0": 7, "1": 7}}'}).starting
    assert resolve(by_timestamp, INFOS, client) == {("t", 0): 30, ("t", 1): 40}


def test_offsets_json_round_trips_with_string_keys_in_order() -> None:
    offsets = {("b", 10): 3, ("a", 2): 1, ("b", 9): 2}
    encoded = to_json(offsets)
    assert json.dumps(encoded) == '{"a": {"2": 1}, "b": {"9": 2, "10": 3}}'
    assert from_json(json.loads(json.dumps(encoded))) == offsets
    with pytest.raises(ValueError, match="not a tqbroker offset"):
        from_json({"a": 1})


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=8),
    st.integers(1, 3000),
)
def test_rate_limit_takes_exactly_the_budget_in_proportion(
    sizes: list[tuple[int, int]], max_rows: int
) -> None:
    start = {("t", p): begin for p, (begin, _) in enumerate(sizes)}
    latest = {("t", p): begin + backlog for p, (begin, backlog) in enumerate(sizes)}
    end = rate_limit(start, latest, max_rows)
    taken = {tp: end[tp] - start[tp] for tp in start}
    total = sum(latest[tp] - start[tp] for tp in start)
    assert all(0 <= taken[tp] <= latest[tp] - start[tp] for tp in start)
    assert sum(taken.values()) == min(total, max_rows)
    waiting = [tp for tp in start if latest[tp] > start[tp]]
    if max_rows >= len(waiting):  # nobody starves
        assert all(taken[tp] >= 1 for tp in waiting)
    if total > max_rows:  # about its share (the minimum of one moves at most one each)
        for tp in waiting:
            share = max_rows * (latest[tp] - start[tp]) / total
            assert abs(taken[tp] - share) <= len(waiting) + 1


def test_ranges_report_or_skip_lost_offsets() -> None:
    start = {("t", 0): 0, ("t", 1): 5}
    end = {("t", 0): 60, ("t", 1): 50, ("t", 2): 9}
    with pytest.raises(DataLossError, match=r"offsets 0 to 9 of t/0 are gone.*failOnDataLoss"):
        ranges(start, end, INFOS, fail_on_data_loss=True)
    assert ranges(start, end, INFOS, fail_on_data_loss=False) == [
        Range("t", 0, 10, 60),
        Range("t", 1, 5, 50),
    ]
    with pytest.raises(DataLossError, match="t/1 ends at 50, before offset 70"):
        ranges({}, {("t", 1): 70}, INFOS, fail_on_data_loss=True)
    # a partition missing from start (new) starts at its earliest offset
    assert ranges({}, {("t", 0): 20}, INFOS, fail_on_data_loss=True) == [Range("t", 0, 10, 20)]


def test_split_by_max_records_and_min_partitions() -> None:
    whole = [Range("t", 0, 0, 10), Range("t", 1, 100, 101)]
    assert split(whole, min_partitions=None, max_records=None) == whole
    assert split(whole, min_partitions=None, max_records=4) == [
        Range("t", 0, 0, 3),
        Range("t", 0, 3, 6),
        Range("t", 0, 6, 10),
        Range("t", 1, 100, 101),
    ]
    pieces = split(whole, min_partitions=6, max_records=None)
    assert len(pieces) >= 6 - 1
    assert sum(r.size for r in pieces) == 11
    assert [r for r in pieces if r.partition == 1] == [Range("t", 1, 100, 101)]


def read_body(values: list[bytes], keys: list[bytes], headers: list[bytes] | None) -> bytes:
    n = len(values)
    return encode_read(
        ReadBatch(
            1000 + n,
            array("q", range(1000, 1000 + n)),
            array("q", [1_700_000_000_000 + i for i in range(n)]),
            BinaryColumn.of(keys),
            BinaryColumn.of(values),
            BinaryColumn.of(headers) if headers is not None else None,
        )
    )


# No deadline: the first examples pay for pyarrow's lazy set-up, and this module runs while a
# SparkSession's JVM may still be busy on the same two cores.
@settings(deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=9), st.text(max_size=5)), max_size=30))
def test_fetched_bodies_become_arrow_batches_in_kafkas_schema(
    records: list[tuple[bytes, str]],
) -> None:
    values = [v for v, _ in records]
    keys = [k.encode() for _, k in records]
    fetched = decode_fetch(read_body(values, keys, None), "tópic", 3, include_headers=False)
    batch = fetched.batch
    assert batch.schema.equals(read_schema(False))
    assert fetched.next_offset == 1000 + len(records)
    assert batch.column("value").to_pylist() == values
    assert batch.column("key").to_pylist() == [k or None for k in keys]  # "" is Kafka's null
    assert batch.column("topic").to_pylist() == ["tópic"] * len(records)
    assert batch.column("partition").to_pylist() == [3] * len(records)
    assert batch.column("offset").to_pylist() == list(range(1000, 1000 + len(records)))
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [(1_700_000_000_000 + i) * 1000 for i in range(len(records))]
    assert batch.column("timestampType").to_pylist() == [1] * len(records)


def test_headers_become_key_value_bytes() -> None:
    headers = [
        b'{"s":"text","b":{"bytes":"AAE="},"n":5,"t":{"x":[1,true]},"z":null}',
        b"",
        b"{}",
    ]
    fetched = decode_fetch(
        read_body([b"a", b"b", b"c"], [b"k"] * 3, headers), "t", 0, include_headers=True
    )
    assert fetched.batch.schema.equals(read_schema(True))
    assert fetched.batch.column("headers").to_pylist() == [
        [
            {"key": "s", "value": b"text"},
            {"key": "b", "value": b"\x00\x01"},
            {"key": "n", "value": b"5"},
            {"key": "t", "value": b'{"x":[1,true]}'},
            {"key": "z", "value": None},
        ],
        None,
        None,
    ]


def test_malformed_bodies_are_refused() -> None:
    body = read_body([b"abc"], [b"k"], None)
    with pytest.raises(ValueError, match="TQR1"):
        decode_fetch(b"TQR2" + body[4:], "t", 0, include_headers=False)
    for cut in (3, 20, len(body) - 1):
        with pytest.raises(ValueError, match="TQR1"):
            decode_fetch(body[:cut], "t", 0, include_headers=False)


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=9),
            st.one_of(st.none(), st.text(max_size=5)),
            st.one_of(st.none(), st.integers(-1, 5)),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 5),
)
def test_arrow_rows_become_write_bodies(
    rows: list[tuple[bytes, str | None, int | None]], skip: int
) -> None:
    table = pa.table(
        {
            "value": pa.array([v for v, _, _ in rows], pa.binary()),
            "key": pa.array([k for _, k, _ in rows], pa.string()),
            "partition": pa.array([p for _, _, p in rows], pa.int32()),
        }
    )
    part = table.slice(min(skip, len(rows) - 1)).combine_chunks().to_batches()[0]
    decoded = decode_write(
        encode_write(part.column("value"), part.column("key"), part.column("partition"))
    )
    expected = rows[min(skip, len(rows) - 1) :]
    assert [decoded.values[i] for i in range(len(decoded))] == [v for v, _, _ in expected]
    assert [decoded.keys[i] for i in range(len(decoded))] == [
        (k or "").encode() for _, k, _ in expected
    ]
    assert list(decoded.partitions) == [-1 if p is None else p for _, _, p in expected]
    assert [decoded.headers[i] for i in range(len(decoded))] == [b""] * len(expected)


def test_write_bodies_check_keys_and_carry_headers() -> None:
    values = pa.array(["a", "b"])
    with pytest.raises(ValueError, match=r"column 'key'.*255"):
        encode_write(values, pa.array(["k" * 256, "k"]))
    with pytest.raises(ValueError, match="column 'key' must hold UTF-8"):
        encode_write(values, pa.array([b"\xff", b"k"]))
    header_type = pa.list_(
        pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
    )
    headers = pa.array(
        [[{"key": "a", "value": b"x"}, {"key": "b", "value": b"\xff"}], None], header_type
    )
    decoded = decode_write(encode_write(values, None, None, headers))
    assert json.loads(decoded.headers[0]) == {"a": "x", "b": {"bytes": "/w=="}}
    assert decoded.headers[1] == b""


def test_executor_reads_tell_lost_offsets_from_present_ones(topics: Topics) -> None:
    """``read_range`` (what executors run) against a real broker: a range that retention cut
    fails with ``failOnDataLoss`` and is read from the earliest offset without it."""
    topics.create(
        "cut", 1, **{"x-stream-max-segment-size-bytes": 1 << 20, "x-max-length-bytes": 2 << 20}
    )
    big = "x" * (128 << 10)
    for i in range(40):
        topics.produce("cut", [{"value": f"{i:03d}{big}"}])

    def trimmed() -> dict[str, int] | None:
        """retention removing a segment"""
        offsets = topics.offsets("cut")[0]
        return offsets if offsets["earliest"] > 0 else None

    now = eventually(trimmed, 30)
    options = {"tqbroker.url": topics.url, "subscribe": "cut", "fetchMaxBytes": "300000"}
    part = TopicRange("cut", 0, 0, now["latest"])
    with pytest.raises(DataLossError, match=rf"offsets 0 to {now['earliest'] - 1} of cut/0"):
        list(read_range(source_options(options, streaming=False), part))
    lenient = source_options({**options, "failOnDataLoss": "false"}, streaming=False)
    batches = list(read_range(lenient, part))
    client_for(lenient.connection).close()  # this process's cached connection
    assert len(batches) > 1  # several fetches
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(now["earliest"], now["latest"]))
    values = [v[:3] for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"%03d" % o for o in offsets]


def test_a_cluster_s_url_list_moves_to_the_next_node_when_one_is_down(topics: Topics) -> None:
    """``tqbroker.url`` takes a cluster's nodes, comma-separated (Kafka's bootstrap list): a
    node that does not answer is passed over; when none answers, the error names each."""
    topics.create("failover", partitions=2)
    down = dead_endpoint()
    client = Client(connection({"tqbroker.url": f"{down}, {topics.url}"}))
    try:
        assert [p.partition for p in client.partitions("failover")] == [0, 1]
        assert [p.partition for p in client.partitions("failover")] == [0, 1]  # stays there
    finally:
        client.close()
    other = dead_endpoint()
    with pytest.raises(BrokerError, match="cannot reach tqbroker") as caught:
        Client(connection({"tqbroker.url": f"{down},{other}"})).partitions("failover")
    assert down in str(caught.value)
    assert other in str(caught.value)
    with pytest.raises(OptionError, match=r"tqbroker\.url"):
        connection({"tqbroker.url": f"{topics.url},ftp://x"})
