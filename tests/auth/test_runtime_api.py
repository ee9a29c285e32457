"""Users, permissions, vhosts and limits changed at runtime over the management API: each
request is sent to tqbroker and to the oracle RabbitMQ 3.10 (when installed) and the statuses
and error bodies compared; the effects (logins, refusals, closed connections, limits) checked
with pika against each of them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import attrs
import httpx
import pika
import pika.exceptions
import pytest

from tests.support.polling import eventually
from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tq() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


def _client(url: str) -> httpx.Client:
    """A connection per request: RabbitMQ's server (and tqbroker's, after a refusal answered
    before the body is read) may close a kept-alive connection just as the next request goes."""
    headers = {"connection": "close"}
    return httpx.Client(base_url=url, auth=("guest", "guest"), timeout=30, headers=headers)


def _answer(response: httpx.Response) -> tuple[int, object]:
    """The status and the JSON body (None when empty)."""
    return response.status_code, response.json() if response.content else None


# (method, path, body): sent in order to both brokers; each answer compared. ``{u}`` and ``{v}``
# are a user and a vhost of this run.
SCRIPT: list[tuple[str, str, object]] = [
    ("PUT", "/api/users/{u}", {"password": "pw", "tags": "management,x"}),
    ("PUT", "/api/users/{u}", {"password": "pw", "tags": ["management", "x"]}),
    ("PUT", "/api/users/{u}", {"password": "pw"}),
    ("PUT", "/api/users/{u}", {"password": "a", "password_hash": "abc", "tags": ""}),
    ("PUT", "/api/users/{u}-h", {"password_hash": "xx", "tags": ""}),
    ("GET", "/api/users/{u}-h", None),
    ("PUT", "/api/vhosts/{v}", {"description": "d", "tags": "a,b"}),
    ("PUT", "/api/vhosts/{v}", {"description": "d2"}),
    ("PUT", "/api/permissions/{v}/{u}", {"configure": ".*", "write": ".*", "read": ".*"}),
    ("PUT", "/api/permissions/{v}/{u}", {"configure": "^a", "write": ".*", "read": ".*"}),
    ("GET", "/api/permissions/{v}/{u}", None),
    ("PUT", "/api/permissions/{v}/{u}", {"configure": ".*"}),
    ("PUT", "/api/permissions/{v}/nosuch-{u}", {"configure": "", "write": "", "read": ""}),
    ("PUT", "/api/permissions/nosuch-{v}/{u}", {"configure": "", "write": "", "read": ""}),
    ("PUT", "/api/topic-permissions/{v}/{u}", {"exchange": "amq.topic", "write": "^a", "read": ""}),
    ("PUT", "/api/topic-permissions/{v}/{u}", {"exchange": "t2", "write": "^b", "read": ".*"}),
    ("PUT", "/api/topic-permissions/{v}/{u}", {"write": "^b", "read": ".*"}),
    ("GET", "/api/topic-permissions/{v}/nosuch-{u}", None),
    ("DELETE", "/api/topic-permissions/{v}/{u}", None),
    ("DELETE", "/api/topic-permissions/{v}/{u}", None),
    ("PUT", "/api/vhost-limits/{v}/max-queues", {"value": 1}),
    ("PUT", "/api/vhost-limits/{v}/max-connections", {"value": -1}),
    ("GET", "/api/vhost-limits/{v}", None),
    ("PUT", "/api/vhost-limits/{v}/max-foo", {"value": 1}),
    ("PUT", "/api/vhost-limits/{v}/max-queues", {"value": "x"}),
    ("PUT", "/api/vhost-limits/{v}/max-queues", {}),
    ("PUT", "/api/vhost-limits/nosuch-{v}/max-queues", {"value": 1}),
    ("GET", "/api/vhost-limits/nosuch-{v}", None),
    ("DELETE", "/api/vhost-limits/{v}/max-connections", None),
    ("DELETE", "/api/vhost-limits/{v}/max-connections", None),
    ("GET", "/api/vhost-limits/{v}", None),
    ("PUT", "/api/user-limits/{u}/max-channels", {"value": 2}),
    ("PUT", "/api/user-limits/{u}/max-connections", {"value": 1}),
    ("PUT", "/api/user-limits/{u}/max-queues", {"value": 1}),
    ("PUT", "/api/user-limits/{u}/max-channels", {"value": 2.5}),
    ("PUT", "/api/user-limits/nosuch-{u}/max-channels", {"value": 2}),
    ("GET", "/api/user-limits/{u}", None),
    ("DELETE", "/api/user-limits/{u}/max-connections", None),
    ("GET", "/api/user-limits/nosuch-{u}", None),
    ("DELETE", "/api/permissions/{v}/{u}", None),
    ("DELETE", "/api/permissions/{v}/{u}", None),
    ("GET", "/api/permissions/{v}/{u}", None),
    ("POST", "/api/users/bulk-delete", {}),
    ("POST", "/api/users/bulk-delete", {"users": ["{u}-h", "nosuch-{u}"]}),
    ("GET", "/api/users/{u}-h", None),
    ("DELETE", "/api/users/nosuch-{u}", None),
    ("DELETE", "/api/vhosts/{v}", None),
    ("DELETE", "/api/vhosts/{v}", None),
    ("DELETE", "/api/users/{u}", None),
]


def _run(client: httpx.Client, user: str, vhost: str) -> list[tuple[str, int, object]]:
    answers = []
    for method, path, body in SCRIPT:
        path = path.format(u=user, v=vhost)
        if isinstance(body, dict):
            body = {k: v.format(u=user) if isinstance(v, str) else v for k, v in body.items()}
            body = {
                k: [x.format(u=user) for x in v] if k == "users" else v for k, v in body.items()
            }
        sent = client.request(method, path, json=body) if body is not None else None
        response = sent or client.request(method, path)
        status, shown = _answer(response)
        if isinstance(shown, dict) and "password_hash" in shown:
            shown = {k: v for k, v in shown.items() if k != "password_hash"}
        answers.append((f"{method} {path}", status, shown))
    return answers


def _normalised(answers: list[tuple[str, int, object]], user: str, vhost: str) -> list[object]:
    """Answers with the run's names replaced, and an Erlang ``invalid_regexp`` term's details
    (PCRE's message) left out."""
    text = repr(answers).replace(user, "U").replace(vhost, "V")
    return [text]


def test_runtime_api_matches_rabbitmq(tq: RunningBroker, rabbitmq_oracle: RabbitMQ) -> None:
    user, vhost = f"rt-{uuid.uuid4().hex[:8]}", f"rtv-{uuid.uuid4().hex[:8]}"
    with _client(tq.http_url) as ours, _client(rabbitmq_oracle.http_url) as theirs:
        got = _run(ours, user, vhost)
        expected = _run(theirs, user, vhost)
    mismatches = [
        (g, e) for g, e in zip(got, expected, strict=True) if (g[1], g[2]) != (e[1], e[2])
    ]
    assert mismatches == []


def test_invalid_pattern_is_400_as_rabbitmq(tq: RunningBroker) -> None:
    """RabbitMQ answers ``["invalid_regexp", pattern, [why, where]]`` (PCRE's words; ours are
    Python's)."""
    with _client(tq.http_url) as client:
        assert (
            client.put("/api/users/re-user", json={"password": "p", "tags": ""}).status_code == 201
        )
        response = client.put(
            "/api/permissions/%2F/re-user", json={"configure": "(", "write": ".*", "read": ".*"}
        )
        assert response.status_code == 400
        reason = response.json()["reason"]
        assert reason[:2] == ["invalid_regexp", "("]
        assert client.delete("/api/users/re-user").status_code == 204


def test_not_administrator_is_refused(tq: RunningBroker) -> None:
    with _client(tq.http_url) as client:
        client.put("/api/users/mgmt-only", json={"password": "p", "tags": "management"})
        client.put(
            "/api/permissions/%2F/mgmt-only", json={"configure": ".*", "write": ".*", "read": ".*"}
        )
        as_them = _client(tq.http_url)
        as_them.auth = httpx.BasicAuth("mgmt-only", "p")
        for method, path in [
            ("PUT", "/api/users/x"),
            ("DELETE", "/api/users/guest"),
            ("PUT", "/api/permissions/%2F/mgmt-only"),
            ("PUT", "/api/vhosts/x"),
            ("DELETE", "/api/vhosts/%2F"),
            ("PUT", "/api/vhost-limits/%2F/max-queues"),
            ("PUT", "/api/user-limits/guest/max-channels"),
        ]:
            response = as_them.request(method, path, json={"value": 1, "tags": ""})
            assert _answer(response) == (
                401,
                {"error": "not_authorised", "reason": "Not administrator user"},
            ), path
        assert client.delete("/api/users/mgmt-only").status_code == 204


@attrs.frozen
class Target:
    """A broker the effect tests run against: tqbroker, then the oracle RabbitMQ."""

    http_url: str
    host: str
    port: int
    name: str = "tqbroker"


@pytest.fixture(scope="module", params=["tqbroker", "rabbitmq"])
def target(request: pytest.FixtureRequest, tq: RunningBroker) -> Target:
    if request.param == "tqbroker":
        return Target(tq.http_url, tq.host, tq.port)
    rabbit: RabbitMQ = request.getfixturevalue("rabbitmq_oracle")  # skips without RabbitMQ
    return Target(rabbit.http_url, "127.0.0.1", rabbit.port, "rabbitmq")


def _amqp(target: Target, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            target.host, target.port, vhost, credentials, connection_attempts=1
        )
    )


def _serve_until_closed(connection: pika.BlockingConnection) -> None:
    """Read from the broker (for at most 5 s) until it closes the connection."""
    connection.process_data_events(time_limit=5)
    connection.channel()


def test_runtime_user_logs_in_and_permissions_apply_at_once(target: Target) -> None:
    ann = f"ann-{uuid.uuid4().hex[:6]}"
    with _client(target.http_url) as client:
        assert (
            client.put(f"/api/users/{ann}", json={"password": "s3", "tags": ""}).status_code == 201
        )
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            _amqp(target, ann, "s3")  # no permissions on / yet
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        client.put(f"/api/permissions/%2F/{ann}", json=everything)
        connection = _amqp(target, ann, "s3")
        connection.channel().queue_declare(f"{ann}-q", auto_delete=True)
        without = client.get("/api/users/without-permissions").json()
        assert ann not in [u["name"] for u in without]
        # Cleared at runtime: the next connection is refused at once.
        assert client.delete(f"/api/permissions/%2F/{ann}").status_code == 204
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            _amqp(target, ann, "s3")
        without = client.get("/api/users/without-permissions").json()
        assert ann in [u["name"] for u in without]
        client.put(f"/api/permissions/%2F/{ann}", json={"configure": "", "write": "", "read": ""})
        # A new password: the open connection stays (as RabbitMQ), the old password is refused.
        client.put(f"/api/users/{ann}", json={"password": "s4", "tags": ""})
        connection.process_data_events(0.2)
        assert connection.is_open
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            _amqp(target, ann, "s3")
        _amqp(target, ann, "s4").close()
        # Deleted: its connection is closed with RabbitMQ's words.
        assert client.delete(f"/api/users/{ann}").status_code == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            _serve_until_closed(connection)
        assert closed.value.reply_code == 320
        assert closed.value.reply_text == f"CONNECTION_FORCED - user '{ann}' is deleted"


def test_deleting_a_vhost_closes_its_connections(target: Target) -> None:
    vhost = f"gone-{uuid.uuid4().hex[:6]}"
    with _client(target.http_url) as client:
        assert client.put(f"/api/vhosts/{vhost}").status_code == 201
        connection = _amqp(target, "guest", "guest", vhost)
        connection.channel().queue_declare("stays-not", durable=True)
        assert client.delete(f"/api/vhosts/{vhost}").status_code == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            _serve_until_closed(connection)
        assert closed.value.reply_code == 320
        texts = {f"CONNECTION_FORCED - vhost '{vhost}' is deleted"}
        if target.name == "rabbitmq":  # its vhost supervisor may close first: "is down"
            texts.add(f"CONNECTION_FORCED - vhost '{vhost}' is down")
        assert closed.value.reply_text in texts
        assert client.get(f"/api/queues/{vhost}/stays-not").status_code == 404


def test_limits_refuse_as_rabbitmq(target: Target) -> None:
    lim = f"lim-{uuid.uuid4().hex[:6]}"
    with _client(target.http_url) as client:
        client.put(f"/api/vhosts/{lim}")
        client.put(f"/api/users/{lim}", json={"password": "p", "tags": ""})
        client.put(
            f"/api/permissions/{lim}/{lim}", json={"configure": ".*", "write": ".*", "read": ".*"}
        )
        client.put(f"/api/vhost-limits/{lim}/max-connections", json={"value": 0})
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            _amqp(target, "guest", "guest", lim)
        assert (
            f"NOT_ALLOWED - access to vhost '{lim}' refused for user 'guest': "
            "connection limit (0) is reached" in str(refused.value)
        )
        client.delete(f"/api/vhost-limits/{lim}/max-connections")
        client.put(f"/api/vhost-limits/{lim}/max-queues", json={"value": 1})
        client.put(f"/api/user-limits/{lim}/max-connections", json={"value": 1})
        client.put(f"/api/user-limits/{lim}/max-channels", json={"value": 2})
        connection = _amqp(target, lim, "p", lim)
        channel = connection.channel()
        channel.queue_declare("q1")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as over:
            channel.queue_declare("q2")
        assert over.value.reply_code == 406
        assert over.value.reply_text == (
            f"PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost '{lim}' (1) "
            "is reached"
        )
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as second:
            _amqp(target, lim, "p", lim)
        assert (
            f"NOT_ALLOWED - connection refused for user '{lim}': user connection limit (1) is "
            "reached" in str(second.value)
        )
        connection.channel()
        connection.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as channels:
            connection.channel()
        assert channels.value.reply_code == 530
        assert channels.value.reply_text == (
            f"NOT_ALLOWED - number of channels opened for user '{lim}' has reached the maximum "
            "allowed user limit of (2)"
        )
        # Its connection closed, the user may connect again (the count is released as the
        # connection ends: a moment after the client heard the close).
        eventually(
            lambda: _amqp(target, lim, "p", lim).close() is None,
            what="the closed connection no longer counts",
            ignoring=(pika.exceptions.ProbableAccessDeniedError,),
        )
        assert client.delete(f"/api/vhosts/{lim}").status_code == 204
        assert client.delete(f"/api/users/{lim}").status_code == 204


def test_imported_vhost_limits_apply(target: Target) -> None:
    """A definitions document's vhost limits (RabbitMQ's export shape) are imported."""
    vhost = f"imp-{uuid.uuid4().hex[:6]}"
    limits = {"value": {"max-queues": 3}, "vhost": vhost, "component": "vhost-limits"}
    document = {"vhosts": [{"name": vhost}], "parameters": [{**limits, "name": "limits"}]}
    with _client(target.http_url) as client:
        response = client.post("/api/definitions", json=document)
        assert response.status_code in (201, 204)
        assert "parameters" not in response.headers.get("x-definitions-skipped", "")
        assert client.get(f"/api/vhost-limits/{vhost}").json() == [
            {"vhost": vhost, "value": {"max-queues": 3}}
        ]
        exported = client.get(f"/api/definitions/{vhost}").json()
        assert exported["parameters"] == [{**limits, "name": "limits"}]
        listed = client.get(f"/api/parameters/vhost-limits/{vhost}").json()
        assert listed == [{**limits, "name": "limits"}]
        assert {**limits, "name": "limits"} in client.get("/api/parameters").json()
        assert client.delete(f"/api/vhosts/{vhost}").status_code == 204
