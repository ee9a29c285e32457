"""Who may do what over the HTTP API where RabbitMQ has the rule, each row answered by tqbroker
and by a real RabbitMQ (the session's oracle; skipped without it) and compared: definitions are
exported and imported by administrators only (a monitoring user into no vhost, a management
user not past its ``configure`` permission, not even into its own vhost); a connection is
closed by an administrator or its own user (a monitoring user sees it, and may not close it);
the Prometheus endpoints are not on the management port (RabbitMQ serves them on its own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pika
import pika.exceptions
import pytest

from tests.support.polling import eventually
from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.testing import running_broker

V = "authz"  # a vhost of its own (the oracle is shared by the session's tests)
PASSWORD = "authz-pw"
MONITOR, MANAGER, POLICYMAKER = "authz-monitor", "authz-manager", "authz-policymaker"
# The manager may write and read in the vhost but configure nothing there.
MANAGER_PERMISSION = ("^$", ".*", ".*")
TAGS = {MONITOR: "monitoring", MANAGER: "management", POLICYMAKER: "policymaker"}
# What the attacker imported: a queue that drops every message and a catch-all binding.
PLANTED = {
    "queues": [
        {"name": "orders", "vhost": V, "durable": True, "auto_delete": False,
         "arguments": {"x-max-length": 0}}
    ],
    "bindings": [
        {"source": "amq.topic", "vhost": V, "destination": "orders",
         "destination_type": "queue", "routing_key": "#", "arguments": {}}
    ],
}  # fmt: skip


def _json(answer: httpx.Response) -> Any:
    return answer.json() if answer.content else None


def definitions_rows(base_url: str) -> list[tuple[str, int, Any]]:
    seen = []
    for user in TAGS:
        for method, path in (
            (method, path)
            for path in ("/api/definitions", f"/api/definitions/{V}")
            for method in ("GET", "POST")
        ):
            # One connection a request: RabbitMQ closes one whose request body it did not read.
            answer = httpx.request(
                method,
                base_url + path,
                json=PLANTED if method == "POST" else None,
                auth=(user, PASSWORD),
                timeout=30,
            )
            seen.append((f"{user} {method} {path}", answer.status_code, _json(answer)))
    return seen


def planted(admin: httpx.Client) -> bool:
    return admin.get(f"/api/queues/{V}/orders").status_code != 404


def connection_rows(base_url: str, amqp_port: int, admin: httpx.Client) -> list[tuple[str, Any]]:
    """A monitoring user's close of the manager's connection, then the manager's own."""
    url = f"amqp://{MANAGER}:{PASSWORD}@127.0.0.1:{amqp_port}/{V}"
    victim = pika.BlockingConnection(pika.URLParameters(url))
    try:
        path = "/api/connections/" + quote(_listed(admin, MANAGER), safe="")
        seen: list[tuple[str, Any]] = []
        for user in (MONITOR, MANAGER):
            with httpx.Client(base_url=base_url, auth=(user, PASSWORD), timeout=30) as client:
                closed = client.delete(path, headers={"x-reason": f"by {user}"})
            seen.append((f"{user} DELETE", (closed.status_code, _json(closed))))
            seen.append((f"after {user}", _outcome(victim)))
        return seen
    finally:
        if victim.is_open:
            victim.close()


def _listed(admin: httpx.Client, user: str) -> str:
    """The name of ``user``'s connection, once the API lists it (RabbitMQ's after its stats
    interval)."""

    def names() -> list[str]:
        return [c["name"] for c in admin.get("/api/connections").json() if c["user"] == user]

    return str(eventually(names, timeout=20, what=f"a connection of {user} listed")[0])


def _outcome(victim: pika.BlockingConnection) -> str:
    if not victim.is_open:
        return "closed before"
    try:
        victim.process_data_events(1.0)
    except pika.exceptions.ConnectionClosedByBroker as closed:
        return f"closed {closed.reply_code} {closed.reply_text}"
    return "open"


def metrics_rows(base_url: str) -> list[tuple[str, int]]:
    paths = ("/metrics", "/metrics/per-object", "/metrics/detailed?family=queue_coarse_metrics")
    return [(path, httpx.get(base_url + path, timeout=30).status_code) for path in paths]


def answers(base_url: str, amqp_port: int, admin: httpx.Client) -> dict[str, Any]:
    found: dict[str, Any] = {"definitions": definitions_rows(base_url)}
    found["planted"] = planted(admin)
    found["connections"] = connection_rows(base_url, amqp_port, admin)
    found["metrics"] = metrics_rows(base_url)
    return found


@pytest.fixture(scope="module")
def tqbroker_answers() -> Iterator[dict[str, Any]]:
    everything = {"/": PermissionConfig(), V: PermissionConfig()}
    users = [UserConfig("guest", "guest", tags=("administrator",), permissions=everything)]
    for user, tag in TAGS.items():
        permission = (
            PermissionConfig(*MANAGER_PERMISSION) if user == MANAGER else PermissionConfig()
        )
        users.append(UserConfig(user, PASSWORD, tags=(tag,), permissions={V: permission}))
    config = BrokerConfig(port=0, http_port=0, vhosts=("/", V), users=tuple(users))
    with (
        running_broker(config) as running,
        httpx.Client(base_url=running.http_url, auth=("guest", "guest"), timeout=30) as admin,
    ):
        yield answers(running.http_url, running.port, admin)


def test_the_rules_hold_in_tqbroker(tqbroker_answers: dict[str, Any]) -> None:
    """Without the oracle too: what RabbitMQ answers (see the comparison below)."""
    not_admin = {"error": "not_authorised", "reason": "Not administrator user"}
    assert {(status, str(body)) for _, status, body in tqbroker_answers["definitions"]} == {
        (401, str(not_admin))
    }
    assert tqbroker_answers["planted"] is False
    not_yours = {"error": "not_authorised", "reason": "User not authorised to access object"}
    assert tqbroker_answers["connections"] == [
        (f"{MONITOR} DELETE", (401, not_yours)),
        (f"after {MONITOR}", "open"),
        (f"{MANAGER} DELETE", (204, None)),
        (f"after {MANAGER}", f"closed 320 CONNECTION_FORCED - by {MANAGER}"),
    ]
    assert {status for _, status in tqbroker_answers["metrics"]} == {404}


def test_rabbitmq_answers_the_same(
    tqbroker_answers: dict[str, Any], rabbitmq_oracle: RabbitMQ
) -> None:
    with httpx.Client(
        base_url=rabbitmq_oracle.http_url, auth=("guest", "guest"), timeout=30
    ) as admin:
        try:
            rabbit = _answers_of_rabbitmq(rabbitmq_oracle, admin)
        finally:  # the oracle is the session's: leave it as it was
            admin.delete(f"/api/vhosts/{V}")
            admin.post("/api/users/bulk-delete", json={"users": list(TAGS)})
    assert rabbit == tqbroker_answers


def _answers_of_rabbitmq(rabbitmq: RabbitMQ, admin: httpx.Client) -> dict[str, Any]:
    assert admin.put(f"/api/vhosts/{V}").status_code in (201, 204)
    for user, tag in TAGS.items():
        body = {"password": PASSWORD, "tags": tag}
        assert admin.put(f"/api/users/{user}", json=body).status_code in (201, 204)
        configure, write, read = MANAGER_PERMISSION if user == MANAGER else (".*",) * 3
        permission = {"configure": configure, "write": write, "read": read}
        assert admin.put(f"/api/permissions/{V}/{user}", json=permission).status_code in (201, 204)
    return answers(rabbitmq.http_url, rabbitmq.port, admin)
