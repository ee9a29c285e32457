"""The HTTP topic API over a real socket (httpx against the broker's hypercorn server): every
endpoint, what AMQP clients see of it, and JSON 4xx errors for bad input."""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.client import Client
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.methods import BasicProperties
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(60)


def declare(http: httpx.Client, topic: str = "orders", partitions: int = 3) -> None:
    response = http.put(f"/topics/{topic}", json={"partitions": partitions})
    assert response.status_code == 201, response.text


def produce(http: httpx.Client, topic: str, **record: Any) -> dict[str, Any]:
    response = http.post(f"/topics/{topic}/messages", json=record)
    assert response.status_code == 201, response.text
    return response.json()


def assert_error(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "message"}
    for word in words:
        assert word in body["message"]


def test_health(http: httpx.Client) -> None:
    response = http.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "alarms": []}


def test_declare_is_one_step_and_idempotent(http: httpx.Client, channel: BlockingChannel) -> None:
    declare(http, "orders", 3)
    again = http.put("/topics/orders", json={"partitions": 3})
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert_error(http.put("/topics/orders", json={"partitions": 4}), 409, "another shape")
    compacted = {"partitions": 3, "arguments": {"x-stream-cleanup-policy": "compact"}}
    assert_error(http.put("/topics/orders", json=compacted), 409, "inequivalent arg")
    # A declaration that cannot be made leaves nothing behind.
    channel.queue_declare("half-2", durable=True)  # a classic queue in the way
    assert_error(http.put("/topics/half", json={"partitions": 3}), 409, "half-2")
    assert_error(http.get("/topics/half-0/offsets"), 404)
    # What AMQP clients see: an x-key-partition exchange and three durable stream queues.
    channel.exchange_declare("orders", "x-key-partition", durable=True, passive=True)
    for n in range(3):
        channel.queue_declare(
            f"orders-{n}", durable=True, arguments={"x-queue-type": "stream"}, passive=True
        )


def test_declare_passes_stream_arguments_and_reports_their_errors(http: httpx.Client) -> None:
    response = http.put("/topics/aged", json={"partitions": 2, "arguments": {"x-max-age": "7D"}})
    assert response.status_code == 201
    bad = http.put("/topics/bad", json={"partitions": 2, "arguments": {"x-max-age": "soon"}})
    assert_error(bad, 409, "x-max-age")
    assert_error(http.put("/topics/zero", json={"partitions": 0}), 400, "partitions")
    assert_error(http.put("/topics/word", json={"partitions": "six"}), 400, "partitions")
    assert_error(http.put("/topics/notjson", content=b"{nope"), 400, "not JSON")


def test_kafka_topic_configs_on_declare_describe_and_alter(
    http: httpx.Client, tqbroker_thread: RunningBroker
) -> None:
    configs = {"retention.ms": 86_400_000, "cleanup.policy": "compact", "segment.bytes": "1048576"}
    response = http.put("/topics/configured", json={"partitions": 2, "configs": configs})
    assert response.status_code == 201, response.text
    described = http.get("/topics/configured").json()
    assert described["arguments"] == {
        "x-max-age": "86400s",
        "x-stream-cleanup-policy": "compact",
        "x-stream-max-segment-size-bytes": 1048576,
        "x-queue-type": "stream",
    }
    assert described["configs"]["retention.ms"] == "86400000"
    assert described["configs"]["retention.bytes"] == "-1"  # the default: no limit
    altered = http.patch(
        "/topics/configured", json={"configs": {"retention.bytes": "2097152", "retention.ms": None}}
    )
    assert altered.status_code == 200, altered.text
    assert altered.json()["configs"]["retention.bytes"] == "2097152"
    assert altered.json()["configs"]["retention.ms"] == "-1"
    arguments = http.get("/topics/configured").json()["arguments"]
    assert arguments["x-max-length-bytes"] == 2097152
    assert "x-max-age" not in arguments
    assert tqbroker_thread.broker is not None  # the streams retain by the new limits now
    queue = tqbroker_thread.broker.vhosts["/"].queues["configured-1"]
    assert (queue.max_bytes, queue.max_age_ms) == (2097152, None)  # type: ignore[attr-defined]
    # Unknown or misspelt names are refused, never stored and ignored; so is a Kafka name
    # given as a stream argument (which did nothing before).
    unknown = http.put("/topics/misspelt", json={"configs": {"retention.msx": "1000"}})
    assert_error(unknown, 400, "Unknown topic config name: retention.msx")
    value = http.put("/topics/misspelt", json={"configs": {"cleanup.policy": "shred"}})
    assert_error(value, 400, "Invalid value shred for configuration cleanup.policy")
    as_argument = http.put("/topics/misspelt", json={"arguments": {"retention.ms": 86_400_000}})
    assert_error(as_argument, 400, "'retention.ms' is a Kafka topic config", "x-max-age")
    stray = http.put("/topics/misspelt", json={"arguments": {"x-max-agee": "7D"}})
    assert_error(stray, 400, "unknown stream argument 'x-max-agee'")
    assert_error(http.get("/topics/misspelt"), 404)
    refused = http.patch("/topics/configured", json={"configs": {"segment.byte": "1048576"}})
    assert_error(refused, 400, "Unknown topic config name: segment.byte")
    assert_error(http.patch("/topics/configured", json={}), 400, "partition count or configs")


def test_produce_by_key_lands_where_amqp_publishes_land(
    http: httpx.Client, channel: BlockingChannel
) -> None:
    declare(http)
    first = produce(http, "orders", value="one", key="customer-7")
    second = produce(http, "orders", value="two", key="customer-7")
    assert first["partition"] == second["partition"]
    assert second["offset"] == first["offset"] + 1
    channel.confirm_delivery()
    channel.basic_publish("orders", "customer-7", b"three")  # the same key over AMQP
    page = http.get(
        "/topics/orders/messages", params={"partition": first["partition"], "offset": 0}
    ).json()
    assert [m["value"] for m in page["messages"]] == ["one", "two", "three"]
    assert [m["offset"] for m in page["messages"]] == [0, 1, 2]
    assert page["next_offset"] == 3


def test_produce_a_batch_with_headers_binary_values_and_an_explicit_partition(
    http: httpx.Client, channel: BlockingChannel
) -> None:
    declare(http)
    payload = bytes(range(256))
    response = http.post(
        "/topics/orders/messages",
        json={
            "records": [
                {"value": base64.b64encode(payload).decode(), "encoding": "base64", "partition": 2},
                {"value": "text", "headers": {"trace": "abc", "n": 7}, "partition": 2},
            ]
        },
    )
    assert response.status_code == 201
    assert response.json() == {
        "offsets": [{"partition": 2, "offset": 0}, {"partition": 2, "offset": 1}]
    }
    messages = http.get("/topics/orders/messages", params={"partition": 2}).json()["messages"]
    assert base64.b64decode(messages[0]["value"]) == payload
    assert messages[0]["encoding"] == "base64"
    assert messages[1]["headers"] == {"trace": "abc", "n": 7}
    # AMQP consumers read the same records, with their headers.
    channel.basic_qos(prefetch_count=10)
    got = []
    for method, properties, body in channel.consume(
        "orders-2", arguments={"x-stream-offset": "first"}, inactivity_timeout=1
    ):
        if method is None:
            break
        got.append((body, properties.headers))
        channel.basic_ack(method.delivery_tag)
        if len(got) == 2:
            break
    channel.cancel()
    assert got[0][0] == payload
    assert got[1][1]["trace"] == "abc"


def test_produce_to_a_single_stream_queue(http: httpx.Client, channel: BlockingChannel) -> None:
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    assert produce(http, "events", value="a") == {"partition": 0, "offset": 0}
    assert http.get("/topics/events/offsets").json()["partitions"] == [
        {"partition": 0, "queue": "events", "earliest": 0, "latest": 1}
    ]


def test_read_paging_limit_and_latest(http: httpx.Client) -> None:
    declare(http, "paged", 1)
    for n in range(10):
        produce(http, "paged", value=str(n))
    page = http.get("/topics/paged/messages", params={"offset": 3, "limit": 4}).json()
    assert [m["value"] for m in page["messages"]] == ["3", "4", "5", "6"]
    assert page["next_offset"] == 7
    latest = http.get("/topics/paged/messages", params={"offset": "latest"}).json()
    assert latest["messages"] == []
    assert latest["next_offset"] == 10


def test_timestamp_seek_and_offsets_for_timestamp(http: httpx.Client) -> None:
    declare(http, "timed", 1)
    for n in range(3):
        produce(http, "timed", value=f"early-{n}")
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.05)
    for n in range(2):
        produce(http, "timed", value=f"late-{n}")
    page = http.get("/topics/timed/messages", params={"timestamp": boundary}).json()
    assert [m["value"] for m in page["messages"]] == ["late-0", "late-1"]
    assert all(m["timestamp"] >= boundary for m in page["messages"])
    offsets = http.get("/topics/timed/offsets", params={"timestamp": boundary}).json()
    assert offsets["partitions"] == [
        {"partition": 0, "queue": "timed-0", "earliest": 0, "latest": 5, "timestamp": 3}
    ]
    future = http.get("/topics/timed/offsets", params={"timestamp": "2999-01-01T00:00:00"})
    assert future.json()["partitions"][0]["timestamp"] is None  # none at or after it


def test_group_offsets_and_lag(http: httpx.Client, tqbroker_thread: RunningBroker) -> None:
    declare(http, "lagging", 2)
    for n in range(10):
        produce(http, "lagging", value=str(n), partition=n % 2)
    assert_error(http.get("/topics/lagging/groups/readers"), 404, "readers")
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    ch = connection.channel()
    ch.basic_qos(prefetch_count=3)
    acked = 0

    def on_message(ch: BlockingChannel, method: Any, _properties: Any, _body: bytes) -> None:
        nonlocal acked
        if acked < 3:  # ack the first three of partition 0; the rest stays unacked
            ch.basic_ack(method.delivery_tag)
            acked += 1

    ch.basic_consume(
        "lagging-0",
        on_message,
        arguments={"x-stream-group": "readers", "x-stream-offset": "first"},
    )
    deadline = time.monotonic() + 5
    while acked < 3 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    connection.process_data_events(time_limit=0.2)
    body = http.get("/topics/lagging/groups/readers").json()
    assert body["group"] == "readers"
    p0, p1 = body["partitions"]
    assert (p0["committed"], p0["latest"], p0["lag"]) == (3, 5, 2)
    assert p0["reader"] is not None
    assert (p1["committed"], p1["lag"], p1["reader"]) == (None, None, None)
    assert body["lag"] == 2
    connection.close()


def test_bad_requests_get_json_errors(http: httpx.Client) -> None:
    declare(http, "strict", 2)
    assert_error(http.get("/topics/nope/messages"), 404, "no topic 'nope'")
    assert_error(http.get("/topics/nope/offsets"), 404)
    assert_error(http.post("/topics/nope/messages", json={"value": "x"}), 404)
    assert_error(http.get("/topics/strict/messages", params={"partition": 5}), 404, "0..1")
    assert_error(http.get("/topics/strict/messages", params={"partition": "x"}), 400)
    assert_error(http.get("/topics/strict/messages", params={"offset": -1}), 400)
    assert_error(http.get("/topics/strict/messages", params={"limit": 0}), 400, "limit")
    assert_error(http.get("/topics/strict/messages", params={"timestamp": "noon"}), 400)
    assert_error(
        http.get("/topics/strict/messages", params={"offset": 1, "timestamp": 5}), 400, "not both"
    )
    assert_error(http.post("/topics/strict/messages", json={"key": "k"}), 400, "value")
    assert_error(http.post("/topics/strict/messages", json=[1, 2]), 400, "JSON object")
    assert_error(
        http.post("/topics/strict/messages", json={"value": "%%%", "encoding": "base64"}),
        400,
        "base64",
    )
    assert_error(
        http.post("/topics/strict/messages", json={"value": "x", "encoding": "rot13"}), 400
    )
    assert_error(http.post("/topics/strict/messages", json={"value": "x", "key": "k" * 300}), 400)
    assert_error(http.post("/topics/strict/messages", json={"records": []}), 400, "records")
    assert_error(http.get("/topics/strict/messages", params={"vhost": "other"}), 404, "vhost")
    assert_error(http.put("/topics/a%2Fb", json={"partitions": 1}), 404)
    assert_error(http.put("/topics/" + "t" * 260, json={"partitions": 1}), 400, "255 bytes")
    assert_error(
        http.post("/topics/strict/messages", json={"value": "x", "headers": {"h" * 300: 1}}),
        400,
        "255 bytes",
    )
    assert_error(
        http.post("/topics/strict/messages", content=b'{"value": "x", "headers": {"f": NaN}}'),
        400,
        "NaN",
    )
    assert_error(
        http.post("/topics/strict/messages", content=b'{"value": "\\ud800"}'), 400, "Unicode"
    )
    too_big = "x" * (16 * 1024 * 1024 + 1)
    assert_error(http.post("/topics/strict/messages", json={"value": too_big}), 413)
    # A batch with one bad record writes nothing.
    batch = {"records": [{"value": "ok"}, {"value": "x", "headers": {"h" * 300: 1}}]}
    assert_error(http.post("/topics/strict/messages", json=batch), 400)
    assert http.get("/topics/strict/offsets").json()["partitions"][0]["latest"] == 0
    assert_error(http.get("/no/such/path"), 404)
    assert_error(http.delete("/topics/strict/messages"), 405)
    # ...and the broker goes on serving.
    assert http.get("/health").status_code == 200


def test_credentials_and_vhost_permissions(tqbroker_thread: RunningBroker) -> None:
    with httpx.Client(base_url=tqbroker_thread.http_url, timeout=10) as anonymous:
        assert anonymous.get("/health").status_code == 200  # open, for load balancers
        response = anonymous.get("/topics/any/offsets")
        assert_error(response, 401, "credentials")
        assert response.headers["www-authenticate"].startswith("Basic")
        assert_error(anonymous.get("/topics/any/offsets", auth=("guest", "wrong")), 401)
        assert_error(anonymous.get("/topics/any/offsets", auth=("nobody", "x")), 401)


def test_reads_are_bounded_in_bytes_and_odd_headers_come_back_as_json(
    http: httpx.Client, tqbroker_thread: RunningBroker
) -> None:
    declare(http, "big", 1)
    for _ in range(5):
        produce(http, "big", value="v" * 400_000)
    page = http.get("/topics/big/messages").json()  # 1 MiB by default
    assert len(page["messages"]) == 3
    assert page["next_offset"] == 3
    one = http.get("/topics/big/messages", params={"max_bytes": 1}).json()
    assert len(one["messages"]) == 1  # always at least one
    # Headers pika cannot send (a double, a byte array, Latin-1 text), sent with our own client.
    headers: FieldTable = {"inf": float("inf"), "raw": b"\xff\x00", "latin": "caf\udce9"}
    with Client(tqbroker_thread.url) as client:
        client.confirm_select()
        client.publish("big", "k", b"odd", BasicProperties(headers=headers))
        client.wait_for_confirms()
    last = http.get("/topics/big/messages", params={"offset": 5}).json()["messages"][0]
    assert last["headers"]["inf"] == "inf"
    assert last["headers"]["raw"] == {"bytes": base64.b64encode(b"\xff\x00").decode()}
    assert last["headers"]["latin"] == "caf\ufffd"
