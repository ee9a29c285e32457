"""The management API refuses what it cannot honour, with a 4xx and nothing broken: names and
routing keys AMQP could not carry, malformed or out-of-range numbers, unknown path kinds, a get
of too many messages, a name filter that would backtrack for ever; and a user who may use only
some vhosts sees only their own connections and no other users."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pika
import pytest

from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(60)

USERS = (
    UserConfig(
        "guest",
        "guest",
        tags=("administrator",),
        permissions={"/": PermissionConfig(), "other": PermissionConfig()},
    ),
    UserConfig(
        "bob", "bob-secret", tags=("management",), permissions={"other": PermissionConfig()}
    ),
    UserConfig(
        "eve", "eve-secret", tags=("management",), permissions={"other": PermissionConfig()}
    ),
)


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker(BrokerConfig(port=0, vhosts=("/", "other"), users=USERS)) as running:
        yield running


def client(broker: RunningBroker, user: str = "guest", password: str = "guest") -> httpx.Client:
    return httpx.Client(base_url=broker.http_url, auth=(user, password), timeout=10)


def assert_400(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "bad_request"
    for word in words:
        assert word in body["reason"]


def test_names_and_routing_keys_amqp_could_not_carry(broker: RunningBroker) -> None:
    with client(broker) as http:
        assert http.put("/api/queues/%2F/keys", json={"durable": True}).status_code == 201
        long_key = "k" * 300
        bind = http.post("/api/bindings/%2F/e/amq.direct/q/keys", json={"routing_key": long_key})
        assert_400(bind, "longer than 255 bytes")
        surrogate = http.post(
            "/api/bindings/%2F/e/amq.direct/q/keys",
            content='{"routing_key": "\\ud800"}',  # a lone surrogate, as JSON can spell it
            headers={"content-type": "application/json"},
        )
        assert_400(surrogate, "not valid Unicode")
        publish = {"routing_key": long_key, "payload": "x", "properties": {"delivery_mode": 2}}
        assert_400(http.post("/api/exchanges/%2F/amq.direct/publish", json=publish), "255 bytes")
        publish_text = '{"routing_key": "keys", "payload": "\\ud800", "properties": {}}'
        sent = http.post(
            "/api/exchanges/%2F/amq.direct/publish",
            content=publish_text,
            headers={"content-type": "application/json"},
        )
        assert_400(sent, "Unicode")
        assert_400(http.put(f"/api/queues/%2F/{'a' * 300}", json={}), "longer than 255 bytes")
        assert_400(http.put(f"/api/exchanges/%2F/{'e' * 300}", json={}), "longer than 255 bytes")
        # Nothing was broken: the queue works and every listing answers.
        shown = http.get("/api/queues/%2F/keys").json()
        assert shown["state"] == "running"
        assert http.get("/api/bindings/%2F").status_code == 200
        assert http.get("/api/queues/%2F/keys/bindings").status_code == 200


def test_malformed_and_out_of_range_numbers(broker: RunningBroker) -> None:
    with client(broker) as http:
        http.put("/api/queues/%2F/numbers", json={})
        nested = http.put(
            "/api/queues/%2F/nested",
            content="[" * 200_000,
            headers={"content-type": "application/json"},
        )
        assert_400(nested, "nested too deep")
        for count in ("1e400", "Infinity", '"abc"', "[1]", "0", "10001"):
            body = f'{{"count": {count}, "ackmode": "ack_requeue_true", "encoding": "auto"}}'
            got = http.post(
                "/api/queues/%2F/numbers/get",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert_400(got)
        assert http.post("/api/queues/%2F/numbers/get", json={"count": "2"}).json() == []
        for properties in ('{"delivery_mode": 300}', '{"timestamp": -1}', '{"priority": 1e400}'):
            publish_text = (
                f'{{"routing_key": "numbers", "payload": "x", "properties": {properties}}}'
            )
            sent = http.post(
                "/api/exchanges/%2F/amq.default/publish",
                content=publish_text,
                headers={"content-type": "application/json"},
            )
            assert_400(sent)


def test_unknown_kinds_of_path_are_not_found(broker: RunningBroker) -> None:
    with client(broker) as http:
        made = http.post("/api/bindings/%2F/e/amq.direct/x/amq.topic", json={"routing_key": "a"})
        assert made.status_code == 404
        assert http.get("/api/bindings/%2F/e/amq.direct/x/amq.topic").status_code == 404
        assert http.get("/api/exchanges/%2F/amq.direct/bindings/foo").status_code == 404
        assert http.get("/api/exchanges/%2F/amq.direct/bindings/source").status_code == 200


def test_a_backtracking_name_filter_is_refused_in_time(broker: RunningBroker) -> None:
    with client(broker) as http:
        http.put(f"/api/queues/%2F/{'a' * 24}!", json={})
        started = time.monotonic()
        # Exponential backtracking (2 s on this 25-character name alone, doubling per "a").
        refused = http.get("/api/queues", params={"name": "^(a|a)+$", "use_regex": "true"})
        assert_400(refused, "takes too long")
        assert time.monotonic() - started < 5
        found = http.get("/api/queues", params={"name": "^a+!$", "use_regex": "true"}).json()
        assert [q["name"] for q in found] == [f"{'a' * 24}!"]


def test_a_user_of_some_vhosts_sees_only_their_own(broker: RunningBroker) -> None:
    url = f"amqp://eve:eve-secret@{broker.host}:{broker.port}/other"
    eve = pika.BlockingConnection(pika.URLParameters(url))
    try:
        with client(broker, "bob", "bob-secret") as bob, client(broker) as admin:
            [seen] = admin.get("/api/connections").json()
            assert seen["user"] == "eve"
            assert bob.get("/api/connections").json() == []
            assert bob.get("/api/channels").json() == []
            name = quote(seen["name"], safe="")
            assert bob.get(f"/api/connections/{name}").status_code == 404
            assert bob.delete(f"/api/connections/{name}").status_code == 404
            assert eve.is_open
            for path in ("/api/users", "/api/users/guest", "/api/permissions"):
                refused = bob.get(path)
                assert refused.status_code == 401, path
                assert refused.json() == {
                    "error": "not_authorised",
                    "reason": "Not administrator user",
                }
            assert [v["name"] for v in bob.get("/api/vhosts").json()] == ["other"]
            assert bob.get("/api/overview").json()["message_stats"] == {}
            assert bob.get("/api/whoami").json() == {"name": "bob", "tags": ["management"]}
    finally:
        if eve.is_open:
            eve.close()
