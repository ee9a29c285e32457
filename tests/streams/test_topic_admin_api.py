"""The topic and group administration routes over a real socket (httpx against the broker's
HTTP server, pika as the group member): list, describe, delete and grow topics; list and
describe groups; reset a group's offsets (refused while it has members), and where a member
resumes afterwards."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.polling import eventually
from tqbroker.testing import RunningBroker, start_broker_process

pytestmark = pytest.mark.timeout(60)


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "message"}
    return str(body["message"])


def topic(http: httpx.Client, name: str, partitions: int, messages: int = 0) -> None:
    ok(http.put(f"/topics/{name}", json={"partitions": partitions}), 201)
    for n in range(messages):
        ok(
            http.post(
                f"/topics/{name}/messages", json={"value": f"m{n}", "partition": n % partitions}
            ),
            201,
        )


def read_as_group(url: str, queues: list[str], group: str, count: int) -> pika.BlockingConnection:
    """A group member on ``queues`` that acks ``count`` messages, then stays (open)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    acked = 0

    def on_message(ch: BlockingChannel, method: Any, _properties: Any, _body: bytes) -> None:
        nonlocal acked
        if acked < count:
            ch.basic_ack(method.delivery_tag)
            acked += 1

    for queue in queues:
        channel.basic_consume(
            queue, on_message, arguments={"x-stream-group": group, "x-stream-offset": "first"}
        )
    deadline = time.monotonic() + 20
    while acked < count:
        assert time.monotonic() < deadline, f"acked {acked} of {count}"
        connection.process_data_events(time_limit=0.05)
    connection.process_data_events(time_limit=0.3)  # the acks reach the broker
    return connection


def test_list_describe_and_delete_topics(http: httpx.Client, channel: BlockingChannel) -> None:
    topic(http, "orders", 3, messages=6)
    channel.queue_declare("plain", durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_declare("classic", durable=True)
    listed = ok(http.get("/topics"))
    assert listed == [
        {"topic": "orders", "partitions": 3, "partitioned": True, "vhost": "/"},
        {"topic": "plain", "partitions": 1, "partitioned": False, "vhost": "/"},
    ]
    described = ok(http.get("/topics/orders"))
    assert [p["queue"] for p in described["partitions"]] == ["orders-0", "orders-1", "orders-2"]
    for p in described["partitions"]:
        assert (p["log_start_offset"], p["log_end_offset"], p["messages"]) == (0, 2, 2)
        assert p["segments"] >= 1
        assert p["bytes"] > 0
    assert described["arguments"] == {"x-queue-type": "stream"}
    assert described["groups"] == []
    assert "no topic 'nope'" in error(http.get("/topics/nope"), 404)
    ok(http.delete("/topics/orders"))
    assert [t["topic"] for t in ok(http.get("/topics"))] == ["plain"]
    error(http.delete("/topics/orders"), 404)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):  # the exchange went too
        channel.exchange_declare("orders", passive=True)


def test_partitions_grow_only(http: httpx.Client) -> None:
    ok(http.put("/topics/grow", json={"partitions": 2, "arguments": {"x-max-age": "7D"}}), 201)
    message = error(http.patch("/topics/grow", json={"partitions": 1}), 400)
    assert message == "Topic currently has 2 partitions, which is higher than the requested 1."
    assert error(http.patch("/topics/grow", json={"partitions": 2}), 400) == (
        "Topic already has 2 partitions."
    )
    reply = ok(http.patch("/topics/grow", json={"partitions": 4}))
    assert (reply["partitions"], reply["previous_partitions"]) == (4, 2)
    described = ok(http.get("/topics/grow"))
    assert [p["queue"] for p in described["partitions"]] == [f"grow-{n}" for n in range(4)]
    assert described["arguments"]["x-max-age"] == "7D"
    # Keys spread over the four now: the new partitions are bound to the topic's exchange.
    landed = {
        ok(http.post("/topics/grow/messages", json={"value": "x", "key": f"k{n}"}), 201)[
            "partition"
        ]
        for n in range(40)
    }
    assert landed == {0, 1, 2, 3}
    # Redeclaring with the old count says what it has.
    assert "it has 4" in error(http.put("/topics/grow", json={"partitions": 2}), 409)
    error(http.patch("/topics/nope", json={"partitions": 3}), 404)
    error(http.patch("/topics/grow", json={}), 400)


def test_groups_listed_described_and_reset(
    http: httpx.Client, tqbroker_thread: RunningBroker
) -> None:
    topic(http, "events", 2, messages=10)  # five per partition
    topic(http, "other", 1)
    assert ok(http.get("/groups")) == []
    member = read_as_group(tqbroker_thread.url, ["events-0", "events-1"], "billing", 10)
    try:
        assert ok(http.get("/topics/events/groups")) == [
            {"group": "billing", "topic": "events", "members": 1, "state": "Stable"}
        ]
        error(http.get("/topics/other/groups/billing"), 404)  # it reads another topic
        described = ok(http.get("/topics/events/groups/billing"))
        assert described["state"] == "Stable"
        for p in described["partitions"]:
            assert (p["committed"], p["latest"], p["lag"]) == (5, 5, 0)
            assert p["reader"]
            assert p["connection"].startswith("127.0.0.1:")
        refused = http.post(
            "/topics/events/groups/billing/offsets", json={"to": "earliest", "dry_run": True}
        )
        assert error(refused, 409) == (
            "Assignments can only be reset if the group 'billing' is inactive, but the "
            "current state is Stable."
        )
    finally:
        member.close()
    eventually(lambda: ok(http.get("/groups"))[0]["state"] == "Empty")
    assert ok(http.get("/groups")) == [
        {"group": "billing", "topic": "events", "members": 0, "state": "Empty"}
    ]
    path = "/topics/events/groups/billing/offsets"
    dry = ok(http.post(path, json={"to": "offset", "value": 2, "dry_run": True}))
    assert dry["partitions"] == [
        {"partition": 0, "previous": 5, "offset": 2},
        {"partition": 1, "previous": 5, "offset": 2},
    ]
    assert [p["committed"] for p in ok(http.get(path[:-8]))["partitions"]] == [5, 5]  # dry
    done = ok(http.post(path, json={"to": "offset", "value": 3, "partitions": [1]}))
    assert done["partitions"] == [{"partition": 1, "previous": 5, "offset": 3}]
    assert [p["lag"] for p in ok(http.get(path[:-8]))["partitions"]] == [0, 2]
    ok(http.post(path, json={"to": "earliest"}))
    assert [p["committed"] for p in ok(http.get(path[:-8]))["partitions"]] == [0, 0]
    latest = ok(http.post(path, json={"to": "latest", "dry_run": True}))
    assert [p["offset"] for p in latest["partitions"]] == [5, 5]
    future = ok(http.post(path, json={"to": "datetime", "value": "2999-01-01T00:00:00Z"}))
    assert [p["offset"] for p in future["partitions"]] == [5, 5]
    past = ok(http.post(path, json={"to": "offset", "value": -7}))  # clamped, as Kafka does
    assert [p["offset"] for p in past["partitions"]] == [0, 0]
    # A member resumes where the reset put the group: all ten again.
    again = read_as_group(tqbroker_thread.url, ["events-0", "events-1"], "billing", 10)
    again.close()
    error(http.post(path, json={"to": "sideways"}), 400)
    error(http.post(path, json={"to": "offset"}), 400)
    error(http.post(path, json={"to": "offset", "value": 1, "partitions": [9]}), 404)
    error(http.post("/topics/nope/groups/g/offsets", json={"to": "earliest"}), 404)


def test_a_reset_is_durable_when_answered(tmp_path: Path) -> None:
    """The broker killed right after the answer: the reset offsets are there after a restart."""
    with start_broker_process(tmp_path) as broker:
        with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=30) as http:
            topic(http, "kept", 2, messages=6)
            path = "/topics/kept/groups/later/offsets"
            ok(http.post(path, json={"to": "offset", "value": 2}))
        broker.kill()
    with (
        start_broker_process(tmp_path) as broker,
        httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=30) as http,
    ):
        found = ok(http.get("/topics/kept/groups/later"))
        assert [p["committed"] for p in found["partitions"]] == [2, 2]
