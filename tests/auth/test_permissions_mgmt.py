"""The management API's own writes check the same permissions as AMQP (RabbitMQ's
``rabbit_mgmt_util`` does): declaring or deleting a queue or exchange needs ``configure``,
purging and getting need ``read`` on the queue, publishing ``write`` on the exchange, binding
``write`` on the destination and ``read`` on the source. Each row runs as a management user
without those permissions against tqbroker and against a real RabbitMQ (the session's oracle;
skipped without it), and the answers (status and JSON) must be the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.testing import running_broker

V = "perm"  # a vhost of its own (the oracle is shared by the session's tests)
USER = ("perm-bob", "bob-pw")
# bob may use the vhost but configure, write and read nothing but names starting "bob-".
BOB_PERMISSION = PermissionConfig("^bob-", "^bob-", "^bob-")
GET = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
PUBLISH = {"properties": {}, "routing_key": "k", "payload": "x", "payload_encoding": "string"}

# (what, method, path, body): every one refused to bob; then the "bob-" twin allowed.
ROWS: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("declare queue", "PUT", f"/api/queues/{V}/{{p}}q-new", {"durable": False}),
    ("purge queue", "DELETE", f"/api/queues/{V}/{{p}}q/contents", None),
    ("get from queue", "POST", f"/api/queues/{V}/{{p}}q/get", GET),
    ("declare exchange", "PUT", f"/api/exchanges/{V}/{{p}}x-new", {"type": "direct"}),
    ("publish", "POST", f"/api/exchanges/{V}/{{p}}x/publish", PUBLISH),
    ("bind queue", "POST", f"/api/bindings/{V}/e/{{p}}x/q/{{p}}q", {"routing_key": "k"}),
    ("bind exchange", "POST", f"/api/bindings/{V}/e/{{p}}x/e/{{p}}x3", {"routing_key": "k"}),
    ("unbind queue", "DELETE", f"/api/bindings/{V}/e/{{p}}x0/q/{{p}}q/k", None),
    ("delete exchange", "DELETE", f"/api/exchanges/{V}/{{p}}x2", None),
    ("delete queue", "DELETE", f"/api/queues/{V}/{{p}}q", None),
]


def topology(client: httpx.Client, prefix: str) -> None:
    """As an administrator: the queue and exchanges the rows touch."""
    for path, body in (
        (f"/api/queues/{V}/{prefix}q", {"durable": False}),
        (f"/api/exchanges/{V}/{prefix}x", {"type": "direct"}),
        (f"/api/exchanges/{V}/{prefix}x2", {"type": "direct"}),
        (f"/api/exchanges/{V}/{prefix}x3", {"type": "direct"}),
        (f"/api/exchanges/{V}/{prefix}x0", {"type": "direct"}),
    ):
        assert client.put(path, json=body).status_code in (201, 204), path
    bind = f"/api/bindings/{V}/e/{prefix}x0/q/{prefix}q"
    assert client.post(bind, json={"routing_key": "k"}).status_code == 201


def answers(base_url: str, admin: httpx.Client) -> list[tuple[str, int, Any]]:
    topology(admin, "")
    topology(admin, "bob-")
    seen: list[tuple[str, int, Any]] = []
    with httpx.Client(base_url=base_url, auth=USER, timeout=30) as bob:
        for prefix in ("", "bob-"):
            for what, method, path, body in ROWS:
                answer = bob.request(method, path.format(p=prefix), json=body)
                payload = answer.json() if answer.content else None
                seen.append((f"{what} {prefix or 'refused'}", answer.status_code, payload))
    return seen


@pytest.fixture(scope="module")
def tqbroker_answers() -> Iterator[list[tuple[str, int, Any]]]:
    bob = UserConfig(*USER, tags=("management",), permissions={V: BOB_PERMISSION})
    everything = {"/": PermissionConfig(), V: PermissionConfig()}
    guest = UserConfig("guest", "guest", tags=("administrator",), permissions=everything)
    config = BrokerConfig(port=0, http_port=0, vhosts=("/", V), users=(guest, bob))
    with (
        running_broker(config) as running,
        httpx.Client(base_url=running.http_url, auth=("guest", "guest"), timeout=30) as admin,
    ):
        yield answers(running.http_url, admin)


def test_refusals_and_allowances_are_rabbitmqs(
    tqbroker_answers: list[tuple[str, int, Any]], rabbitmq_oracle: RabbitMQ
) -> None:
    with httpx.Client(
        base_url=rabbitmq_oracle.http_url, auth=("guest", "guest"), timeout=30
    ) as admin:
        user = {"password": USER[1], "tags": "management"}
        assert admin.put(f"/api/users/{USER[0]}", json=user).status_code in (201, 204)
        assert admin.put(f"/api/vhosts/{V}").status_code in (201, 204)
        permission = {"configure": "^bob-", "write": "^bob-", "read": "^bob-"}
        assert admin.put(f"/api/permissions/{V}/{USER[0]}", json=permission).status_code in (
            201,
            204,
        )
        try:
            rabbit = answers(rabbitmq_oracle.http_url, admin)
        finally:  # the oracle is shared by the session's tests: leave it as it was found
            admin.delete(f"/api/vhosts/{V}")
            admin.delete(f"/api/users/{USER[0]}")
    for ours, theirs in zip(tqbroker_answers, rabbit, strict=True):
        assert ours == theirs


def test_refused_without_the_permission(tqbroker_answers: list[tuple[str, int, Any]]) -> None:
    """Without the oracle too: every unprefixed row refused, every "bob-" row allowed."""
    for what, status, _payload in tqbroker_answers:
        if what.endswith("refused"):
            assert status in (400, 401), what
        else:
            assert status < 300, what
