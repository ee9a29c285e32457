"""The RabbitMQ-compatible management API over real sockets: httpx for the API, pika for what AMQP
clients see of it. Statuses, JSON fields and error texts are RabbitMQ 3.10's (captured from a
loopback RabbitMQ with the management plugin)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.polling import eventually
from tqbroker.auth import check_password
from tqbroker.testing import RunningBroker


def serve_until_closed(connection: pika.BlockingConnection) -> None:
    """Read from the broker (for at most 5 s) until it closes the connection."""
    connection.process_data_events(time_limit=5)
    connection.channel()


pytestmark = pytest.mark.timeout(60)


def assert_api_error(response: httpx.Response, status: int, error: str, reason: str) -> None:
    assert response.status_code == status, response.text
    assert response.json() == {"error": error, "reason": reason}


def test_overview_whoami_nodes_vhosts(http: httpx.Client, tqbroker_thread: RunningBroker) -> None:
    overview = http.get("/api/overview").json()
    assert overview["product_name"] == "tqbroker"
    assert overview["rates_mode"] == "basic"
    assert {"direct", "fanout", "topic", "headers"} <= {
        t["name"] for t in overview["exchange_types"]
    }
    assert {"amqp", "http"} <= {listener["protocol"] for listener in overview["listeners"]}
    # The default exchange and amq.direct, fanout, topic, headers, match (no amq.rabbitmq.trace).
    assert overview["object_totals"]["exchanges"] == 6
    assert overview["queue_totals"] == {
        "messages": 0,
        "messages_ready": 0,
        "messages_unacknowledged": 0,
    }
    assert http.get("/api/whoami").json() == {"name": "guest", "tags": ["administrator"]}
    [node] = http.get("/api/nodes").json()
    assert node["name"] == overview["node"]
    assert node["running"] is True
    assert node["mem_limit"] > 0
    assert node["disk_free"] > 0
    assert node["fd_total"] > 0
    assert http.get(f"/api/nodes/{quote(node['name'])}").json()["name"] == node["name"]
    [vhost] = http.get("/api/vhosts").json()
    assert vhost["name"] == "/"
    assert vhost["messages"] == 0
    assert http.get("/api/vhosts/%2F").json()["name"] == "/"
    assert_api_error(http.get("/api/vhosts/nosuch"), 404, "Object Not Found", "Not Found")
    assert_api_error(http.get("/api/nosuch"), 404, "Object Not Found", "Not Found")
    refused = httpx.get(tqbroker_thread.http_url + "/api/overview", auth=("guest", "wrong"))
    assert_api_error(refused, 401, "not_authorized", "Login failed")
    assert refused.headers["www-authenticate"].startswith("Basic")


def test_queue_lifecycle(http: httpx.Client, channel: BlockingChannel) -> None:
    created = http.put(
        "/api/queues/%2F/q1", json={"durable": True, "arguments": {"x-max-length": 5}}
    )
    assert created.status_code == 201
    assert (
        http.put(
            "/api/queues/%2F/q1", json={"durable": "true", "arguments": {"x-max-length": 5}}
        ).status_code
        == 204
    )
    assert_api_error(
        http.put("/api/queues/%2F/q1", json={"durable": False}),
        400,
        "bad_request",
        "inequivalent arg 'durable' for queue 'q1' in vhost '/': "
        "received 'false' but current is 'true'",
    )
    assert_api_error(
        http.put("/api/queues/%2F/amq.q", json={}), 401, "not_authorised", "Access refused."
    )
    assert_api_error(
        http.put("/api/queues/nosuch/q", json={}), 404, "Object Not Found", "Not Found"
    )
    # What AMQP sees: the queue, durable, with its argument.
    assert channel.queue_declare("q1", durable=True, arguments={"x-max-length": 5}, passive=True)
    publish = {
        "properties": {"delivery_mode": 2, "headers": {"h": 1}},
        "routing_key": "q1",
        "payload": "hello",
        "payload_encoding": "string",
    }
    assert http.post("/api/exchanges/%2F/amq.default/publish", json=publish).json() == {
        "routed": True
    }
    unrouted = dict(publish, routing_key="nowhere")
    assert http.post("/api/exchanges/%2F/amq.default/publish", json=unrouted).json() == {
        "routed": False
    }
    assert_api_error(
        http.post("/api/exchanges/%2F/nosuch/publish", json=publish),
        400,
        "bad_request",
        "NOT_FOUND - no exchange 'nosuch' in vhost '/'",
    )
    shown = http.get("/api/queues/%2F/q1").json()
    assert shown["messages"] == shown["messages_ready"] == 1
    assert shown["type"] == "classic"
    assert shown["durable"] is True
    assert shown["state"] == "running"
    assert shown["arguments"] == {"x-max-length": 5}
    assert shown["consumer_details"] == []
    # Get: requeued as it was (redelivered the next time), then acked.
    get = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 50000}
    [first] = http.post("/api/queues/%2F/q1/get", json=get).json()
    assert first == {
        "payload_bytes": 5,
        "redelivered": False,
        "exchange": "",
        "routing_key": "q1",
        "message_count": 0,
        "properties": {"delivery_mode": 2, "headers": {"h": 1}},
        "payload": "hello",
        "payload_encoding": "string",
    }
    get = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"}
    [again] = http.post("/api/queues/%2F/q1/get", json=get).json()
    assert again["redelivered"] is True
    assert again["payload"] == "aGVsbG8="
    assert http.get("/api/queues/%2F/q1").json()["messages"] == 0
    # Purge, delete if empty / unused, delete.
    http.post("/api/exchanges/%2F/amq.default/publish", json=publish)
    assert_api_error(
        http.delete("/api/queues/%2F/q1?if-empty=true"),
        400,
        "bad_request",
        "queue 'q1' in vhost '/' not empty",
    )
    assert http.delete("/api/queues/%2F/q1/contents").status_code == 204
    assert channel.queue_declare("q1", passive=True).method.message_count == 0
    assert http.delete("/api/queues/%2F/q1?if-empty=true").status_code == 204
    assert_api_error(http.get("/api/queues/%2F/q1"), 404, "Object Not Found", "Not Found")
    assert_api_error(http.delete("/api/queues/%2F/q1"), 404, "Object Not Found", "Not Found")
    assert_api_error(
        http.delete("/api/queues/%2F/q1/contents"), 404, "Object Not Found", "Not Found"
    )


def test_stream_queue_reports_its_log(http: httpx.Client, channel: BlockingChannel) -> None:
    channel.queue_declare("s1", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for n in range(3):
        channel.basic_publish("", "s1", b"m%d" % n)
    shown = http.get("/api/queues/%2F/s1").json()
    assert shown["type"] == "stream"
    assert shown["messages"] == 3
    assert (shown["first_offset"], shown["committed_offset"]) == (0, 3)
    assert shown["segments"] == 1


def test_exchanges_and_bindings(http: httpx.Client, channel: BlockingChannel) -> None:
    assert (
        http.put("/api/exchanges/%2F/e1", json={"type": "fanout", "durable": True}).status_code
        == 201
    )
    assert (
        http.put("/api/exchanges/%2F/e1", json={"type": "fanout", "durable": True}).status_code
        == 204
    )
    assert_api_error(
        http.put("/api/exchanges/%2F/e1", json={"type": "topic"}),
        400,
        "bad_request",
        "inequivalent arg 'type' for exchange 'e1' in vhost '/': "
        "received 'topic' but current is 'fanout'",
    )
    assert http.put("/api/exchanges/%2F/e2", json={}).status_code == 201  # direct by default
    assert http.get("/api/exchanges/%2F/e2").json()["type"] == "direct"
    assert_api_error(
        http.delete("/api/exchanges/%2F/amq.direct"), 401, "not_authorised", "Access refused."
    )
    assert http.get("/api/exchanges/%2F/amq.default").json()["name"] == ""
    channel.queue_declare("bq")
    created = http.post(
        "/api/bindings/%2F/e/e1/q/bq", json={"routing_key": "k", "arguments": {"a": 1}}
    )
    assert created.status_code == 201
    destination, props = created.headers["location"].split("/")
    assert destination == "bq"
    assert props.startswith("k~")
    [binding] = http.get("/api/bindings/%2F/e/e1/q/bq").json()
    assert binding == {
        "source": "e1",
        "vhost": "/",
        "destination": "bq",
        "destination_type": "queue",
        "routing_key": "k",
        "arguments": {"a": 1},
        "properties_key": props,
    }
    assert http.get(f"/api/bindings/%2F/e/e1/q/bq/{quote(props)}").json() == binding
    assert http.post("/api/bindings/%2F/e/e1/e/e2", json={"routing_key": "x"}).status_code == 201
    as_destination = http.get("/api/exchanges/%2F/e2/bindings/destination").json()
    assert [(b["source"], b["destination_type"]) for b in as_destination] == [("e1", "exchange")]
    queue_bindings = http.get("/api/queues/%2F/bq/bindings").json()
    assert [(b["source"], b["routing_key"]) for b in queue_bindings] == [("", "bq"), ("e1", "k")]
    # The binding routes: a publish to e1 reaches bq.
    assert http.post(
        "/api/exchanges/%2F/e1/publish", json={"routing_key": "", "payload": "x", "properties": {}}
    ).json() == {"routed": True}
    assert channel.queue_declare("bq", passive=True).method.message_count == 1
    assert_api_error(
        http.delete("/api/exchanges/%2F/e1?if-unused=true"),
        400,
        "bad_request",
        "exchange 'e1' in vhost '/' in use",
    )
    assert http.delete(f"/api/bindings/%2F/e/e1/q/bq/{quote(props)}").status_code == 204
    assert_api_error(
        http.delete(f"/api/bindings/%2F/e/e1/q/bq/{quote(props)}"),
        404,
        "Object Not Found",
        "Not Found",
    )
    assert http.delete("/api/exchanges/%2F/e1").status_code == 204
    assert_api_error(http.get("/api/exchanges/%2F/e1"), 404, "Object Not Found", "Not Found")


def test_listing_parameters(http: httpx.Client, channel: BlockingChannel) -> None:
    for name in ("b", "a", "c2", "c1"):
        channel.queue_declare(name)
    names = [q["name"] for q in http.get("/api/queues?sort=name").json()]
    assert names == ["a", "b", "c1", "c2"]
    assert [q["name"] for q in http.get("/api/queues?sort=name&sort_reverse=true").json()] == names[
        ::-1
    ]
    page = http.get("/api/queues/%2F?page=2&page_size=3&sort=name").json()
    assert {k: v for k, v in page.items() if k != "items"} == {
        "filtered_count": 4,
        "item_count": 1,
        "page": 2,
        "page_count": 2,
        "page_size": 3,
        "total_count": 4,
    }
    assert [q["name"] for q in page["items"]] == ["c2"]
    filtered = http.get("/api/queues?page=1&name=c&sort=name").json()
    assert [q["name"] for q in filtered["items"]] == ["c1", "c2"]
    assert filtered["total_count"] == 4
    regex = http.get("/api/queues?page=1&name=^[ab]$&use_regex=true&sort=name").json()
    assert [q["name"] for q in regex["items"]] == ["a", "b"]
    assert http.get("/api/queues?columns=name,messages,arguments&sort=name").json()[0] == {
        "name": "a",
        "messages": 0,
        "arguments": {},
    }
    assert_api_error(
        http.get("/api/queues?page=5&page_size=1"),
        400,
        "page_out_of_range",
        "Page out of range, page: 5 page size: 1, len: 4",
    )
    assert http.get("/api/queues?page=0").status_code == 400


def test_connections_channels_consumers_and_close(
    http: httpx.Client, tqbroker_thread: RunningBroker
) -> None:
    params = pika.URLParameters(tqbroker_thread.url)
    params.client_properties = {"connection_name": "probe"}
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("cq")
        channel.basic_qos(prefetch_count=5)
        channel.basic_consume("cq", lambda *_: None, consumer_tag="ctag1")
        [shown] = http.get("/api/connections").json()
        assert shown["user"] == "guest"
        assert shown["vhost"] == "/"
        assert shown["user_provided_name"] == "probe"
        assert shown["protocol"] == "AMQP 0-9-1"
        assert shown["auth_mechanism"] == "PLAIN"
        assert shown["client_properties"]["product"] == "Pika Python Client Library"
        assert shown["channels"] == 1
        assert shown["peer_host"] == "127.0.0.1"
        assert shown["name"] == f"127.0.0.1:{shown['peer_port']} -> 127.0.0.1:{shown['port']}"
        name = quote(shown["name"], safe="")
        assert http.get(f"/api/connections/{name}").json()["name"] == shown["name"]
        [ch] = http.get(f"/api/connections/{name}/channels").json()
        assert ch["name"] == f"{shown['name']} (1)"
        assert ch["confirm"] is True
        assert ch["consumer_count"] == 1
        assert ch["prefetch_count"] == 5
        assert http.get("/api/channels").json()[0]["name"] == ch["name"]
        assert http.get(f"/api/channels/{quote(ch['name'], safe='')}").json()["number"] == 1
        [consumer] = http.get("/api/consumers/%2F").json()
        assert consumer["consumer_tag"] == "ctag1"
        assert consumer["queue"] == {
            "name": "cq",
            "vhost": "/",
        }
        assert consumer["prefetch_count"] == 5
        assert consumer["ack_required"] is True
        assert consumer["channel_details"]["connection_name"] == shown["name"]
        queue = http.get("/api/queues/%2F/cq").json()
        assert queue["consumers"] == 1
        assert queue["consumer_details"][0]["consumer_tag"] == "ctag1"
        overview = http.get("/api/overview").json()["object_totals"]
        assert (overview["connections"], overview["channels"], overview["consumers"]) == (1, 1, 1)
        closed = http.delete(f"/api/connections/{name}", headers={"X-Reason": "bye now"})
        assert closed.status_code == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            serve_until_closed(connection)
        assert (raised.value.reply_code, raised.value.reply_text) == (
            320,
            "CONNECTION_FORCED - bye now",
        )
        eventually(lambda: http.get("/api/connections").json() == [], 5)
        assert_api_error(
            http.delete(f"/api/connections/{name}"), 404, "Object Not Found", "Not Found"
        )
    finally:
        if connection.is_open:
            connection.close()


def test_health_checks(http: httpx.Client, tqbroker_thread: RunningBroker) -> None:
    assert http.get("/api/aliveness-test/%2F").json() == {"status": "ok"}
    assert http.get("/api/queues/%2F/aliveness-test").json()["messages"] == 0
    assert_api_error(http.get("/api/aliveness-test/nosuch"), 404, "Object Not Found", "Not Found")
    assert http.get("/api/health/checks/virtual-hosts").json() == {"status": "ok"}
    assert http.get("/api/health/checks/ready-to-serve-clients").json() == {"status": "ok"}
    port = tqbroker_thread.port
    assert http.get(f"/api/health/checks/port-listener/{port}").json() == {
        "status": "ok",
        "port": port,
    }
    missing = http.get("/api/health/checks/port-listener/1")
    assert missing.status_code == 503
    body: dict[str, Any] = missing.json()
    assert body["status"] == "failed"
    assert body["missing"] == 1
    assert port in body["ports"]


def test_users_and_permissions(http: httpx.Client) -> None:
    # As RabbitMQ 3.10 answers administrators: the hash and its algorithm included.
    (guest,) = http.get("/api/users").json()
    assert guest["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert check_password("guest", guest.pop("password_hash"))
    assert guest == {
        "name": "guest",
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": ["administrator"],
        "limits": {},
    }
    assert http.get("/api/users/guest").json()["name"] == "guest"
    assert_api_error(http.get("/api/users/nobody"), 404, "Object Not Found", "Not Found")
    everything = {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
    assert http.get("/api/permissions").json() == [everything]
    assert http.get("/api/users/guest/permissions").json() == [everything]
    assert http.get("/api/vhosts/%2F/permissions").json() == [everything]
    assert http.put("/api/users/someone", json={"password": "x", "tags": ""}).status_code == 201


def test_checks_and_features_it_does_not_have(http: httpx.Client) -> None:
    assert http.get("/api/health/checks/protocol-listener/amqp091").json() == {
        "status": "ok",
        "protocol": "amqp",
    }
    missing = http.get("/api/health/checks/protocol-listener/mqtt")
    assert missing.status_code == 503
    assert {"amqp", "http"} <= set(missing.json()["protocols"])
    single = {"status": "ok", "reason": "single node cluster"}
    assert http.get("/api/health/checks/node-is-quorum-critical").json() == single
    for path in ("/api/policies", "/api/parameters", "/api/users/without-permissions"):
        assert http.get(path).json() == [], path


def test_quorum_queue_declared_over_the_api(http: httpx.Client) -> None:
    quorum = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
    assert http.put("/api/queues/%2F/qq", json=quorum).status_code == 201
    shown = http.get("/api/queues/%2F/qq").json()
    assert shown["type"] == "quorum"
    assert shown["arguments"] == {"x-queue-type": "quorum"}
    assert_api_error(
        http.put("/api/queues/%2F/qq2", json={**quorum, "durable": False}),
        400,
        "bad_request",
        "invalid property 'non-durable' for queue 'qq2' in vhost '/'",
    )
