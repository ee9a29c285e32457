"""The broker with ``auth_backends = ["http", "internal"]`` (plugins/auth_http) against a real
Starlette auth service on 127.0.0.1: pika logs in as users only the service knows, the tags of
its answer gate the management API, a vhost it refuses is refused at connection.open, its
answers are cached for ``cache_ttl``, and a service that is down, failing or slow refuses its
users (a clear log line, never a password) while the broker keeps serving internal users."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping

import attrs
import httpx
import pika
import pytest

from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

from .http_auth_service import AuthService, running_service

pytestmark = pytest.mark.timeout(60)

CACHE_TTL = 1.0
DENY_TTL = 0.5
TIMEOUT = 0.5
# Quick refusals and no rate limit: the tests log in wrongly on purpose.
QUICK = BrokerConfig(port=0, auth_failure_delay=0.01, auth_failure_burst=1000)


def config(options: Mapping[str, object]) -> BrokerConfig:
    backends = ("http", "internal")
    return attrs.evolve(QUICK, auth_backends=backends, auth_backend_options={"http": options})


@pytest.fixture(scope="module")
def shared() -> Iterator[AuthService]:
    service = AuthService(
        users={
            "alice": ("alice-pw", "allow management"),
            "bob": ("bob-pw", "allow"),
            "root": ("root-pw", "allow administrator"),
            "dave": ("dave-pw", "allow"),
            "erin": ("erin-pw", "allow"),
            # Logged in by one test each (no earlier success kept in a cache).
            "carl": ("carl-pw", "allow"),
            "dora": ("dora-pw", "allow"),
        },
        vhosts={("alice", "/"), ("bob", "/"), ("root", "/"), ("erin", "/"), ("carl", "/")},
        # round_trip's server-named queue, and its publish through the default exchange
        resources={
            (user, "/", name, kind, permission)
            for user in ("alice", "bob", "root", "erin", "frank", "carl")
            for name, kind, permission in [
                ("*", "queue", "configure"),
                ("*", "queue", "read"),
                ("amq.default", "exchange", "write"),
            ]
        },
    )
    with running_service(service):
        yield service


@pytest.fixture
def service(shared: AuthService) -> AuthService:
    shared.reset()
    return shared


@pytest.fixture(scope="module")
def broker(shared: AuthService) -> Iterator[RunningBroker]:
    options = shared.options(cache_ttl=CACHE_TTL, deny_cache_ttl=DENY_TTL, timeout=TIMEOUT)
    with running_broker(config(options)) as running:
        yield running


def url(broker: RunningBroker, user: str, password: str, vhost: str = "%2F") -> str:
    return f"amqp://{user}:{password}@{broker.host}:{broker.port}/{vhost}"


def round_trip(amqp_url: str) -> None:
    """Log in, declare a queue, publish to it and get the message back."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"hello")
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert (method is not None, body) == (True, b"hello")
    finally:
        connection.close()


def refusal(amqp_url: str) -> str:
    """What pika says when the broker refuses ``amqp_url``'s login or vhost."""
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        pika.BlockingConnection(pika.URLParameters(amqp_url))
    return repr(refused.value).replace("\\", "")  # unescaped quotes


def test_users_only_the_service_knows_log_in(broker: RunningBroker, service: AuthService) -> None:
    round_trip(url(broker, "alice", "alice-pw"))
    assert service.fields("user") == [{"username": "alice", "password": "alice-pw"}]
    assert service.fields("vhost") == [
        {"username": "alice", "vhost": "/", "ip": "127.0.0.1", "tags": "management"}
    ]
    assert "403" in refusal(url(broker, "alice", "wrong"))
    assert "403" in refusal(url(broker, "mallory", "pw"))
    round_trip(broker.url)  # guest: refused by the service, then found by "internal"


def test_tags_from_the_answer_gate_the_management_api(
    broker: RunningBroker, service: AuthService
) -> None:
    with httpx.Client(base_url=broker.http_url, timeout=10) as http:
        whoami = http.get("/api/whoami", auth=("alice", "alice-pw"))
        assert whoami.status_code == 200
        assert whoami.json() == {"name": "alice", "tags": ["management"]}
        untagged = http.get("/api/whoami", auth=("bob", "bob-pw"))
        assert untagged.status_code == 401
        assert "Not management user" in untagged.text
        assert http.get("/api/users", auth=("alice", "alice-pw")).status_code == 401
        assert http.get("/api/users", auth=("root", "root-pw")).status_code == 200


def test_a_vhost_the_service_refuses_is_refused_at_open(
    broker: RunningBroker, service: AuthService
) -> None:
    text = refusal(url(broker, "dave", "dave-pw"))
    assert "530" in text
    assert "access to vhost '/' refused for user 'dave'" in text
    assert service.fields("vhost")[-1]["username"] == "dave"


def test_answers_are_kept_for_cache_ttl(broker: RunningBroker, service: AuthService) -> None:
    round_trip(url(broker, "erin", "erin-pw"))
    round_trip(url(broker, "erin", "erin-pw"))
    assert (service.count("user"), service.count("vhost")) == (1, 1)
    time.sleep(CACHE_TTL + 0.1)
    round_trip(url(broker, "erin", "erin-pw"))
    assert (service.count("user"), service.count("vhost")) == (2, 2)


def test_a_deny_is_kept_for_deny_cache_ttl(broker: RunningBroker, service: AuthService) -> None:
    assert "403" in refusal(url(broker, "frank", "frank-pw"))
    service.users["frank"] = ("frank-pw", "allow")
    service.vhosts.add(("frank", "/"))
    assert "403" in refusal(url(broker, "frank", "frank-pw"))  # the deny, from the cache
    assert service.count("user") == 1
    time.sleep(DENY_TTL + 0.1)
    round_trip(url(broker, "frank", "frank-pw"))
    assert service.count("user") == 2


def test_a_failing_answer_is_not_kept(
    broker: RunningBroker, service: AuthService, caplog: pytest.LogCaptureFixture
) -> None:
    # carl: a user no earlier test logged in (a success is kept for the cache TTL).
    service.status = 500
    with caplog.at_level(logging.WARNING):
        assert "403" in refusal(url(broker, "carl", "carl-pw"))
    assert "auth backend 'http' could not authenticate 'carl'" in caplog.text
    assert "HTTP 500" in caplog.text
    assert "carl-pw" not in caplog.text
    service.status = 200  # the service is back: carl logs in at once
    round_trip(url(broker, "carl", "carl-pw"))


def test_a_slow_service_is_bounded_by_the_timeout(
    broker: RunningBroker, service: AuthService, caplog: pytest.LogCaptureFixture
) -> None:
    service.delay = 5
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert "403" in refusal(url(broker, "dora", "dora-pw"))  # not logged in before
    assert time.monotonic() - started < TIMEOUT + 1.5
    assert f"no answer within {TIMEOUT:g} s" in caplog.text


def test_the_service_down_refuses_its_users_and_internal_ones_still_work(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kinds = ("user", "vhost", "resource", "topic")
    dead = {f"{k}_path": f"http://127.0.0.1:1/auth/{k}" for k in kinds}
    with running_broker(config(dead)) as down, caplog.at_level(logging.WARNING):
        assert "403" in refusal(url(down, "alice", "alice-pw"))
        round_trip(down.url)  # guest, from the internal database
        with httpx.Client(base_url=down.http_url, timeout=10) as http:
            assert http.get("/api/whoami", auth=("alice", "alice-pw")).status_code == 401
            assert http.get("/api/whoami", auth=("guest", "guest")).status_code == 200
    line = next(r.getMessage() for r in caplog.records if "could not authenticate" in r.message)
    assert line.startswith("auth backend 'http' could not authenticate 'alice': HTTP auth service")
    assert "http://127.0.0.1:1/auth/user" in line
    assert "ConnectError" in line
    assert "alice-pw" not in caplog.text


def test_resource_and_topic_checks_ask_the_service(
    broker: RunningBroker, service: AuthService
) -> None:
    """Through AMQP: each operation's check is a request to ``resource_path`` or ``topic_path``
    with RabbitMQ's fields, and a deny is RabbitMQ's 403 for it."""
    service.users["paul"] = ("paul-pw", "allow")
    service.vhosts.add(("paul", "/"))
    service.resources |= {
        ("paul", "/", "jobs", "queue", "configure"),
        ("paul", "/", "jobs", "queue", "read"),
        ("paul", "/", "amq.default", "exchange", "write"),
        ("paul", "/", "events", "exchange", "write"),
    }
    service.topics.add(("paul", "/", "events", "eu.orders", "write"))
    admin = pika.BlockingConnection(pika.URLParameters(broker.url))  # guest: internal
    admin.channel().exchange_declare("events", "topic")
    connection = pika.BlockingConnection(pika.URLParameters(url(broker, "paul", "paul-pw")))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs")
        channel.basic_publish("", "jobs", b"job")
        assert channel.basic_get("jobs", auto_ack=True)[2] == b"job"
        channel.basic_publish("events", "eu.orders", b"allowed")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_publish("events", "us.orders", b"refused")
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == (
            "ACCESS_REFUSED - access to topic 'us.orders' in exchange 'events' in vhost '/' "
            "refused for user 'paul'"
        )
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("other")
        assert refused.value.reply_code == 403
        assert "access to queue 'other' in vhost '/' refused for user 'paul'" in (
            refused.value.reply_text
        )
    finally:
        connection.close()
        admin.close()
    asked = {(f["resource"], f["name"], f["permission"]) for f in service.fields("resource")}
    assert asked >= {
        ("queue", "jobs", "configure"),
        ("exchange", "amq.default", "write"),
        ("queue", "jobs", "read"),
        ("exchange", "events", "write"),
        ("queue", "other", "configure"),
    }
    topic = service.fields("topic")[-1]
    assert (topic["name"], topic["routing_key"], topic["permission"]) == (
        "events",
        "us.orders",
        "write",
    )
    assert topic["variable_map.username"] == "paul"
