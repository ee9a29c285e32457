"""What is changed at runtime survives a restart of ``python -m tqbroker`` on the same data
directory (users, permissions, topic permissions, user and vhost limits, vhosts with their
description), and a deleted vhost's durable queue leaves nothing of its messages on disk."""

from __future__ import annotations

from pathlib import Path

import httpx
import pika
import pytest

from tqbroker.testing import BrokerProcess, start_broker_process

pytestmark = pytest.mark.timeout(120)

MARKER = b"runtime-vhost-deletion-marker-6f1c"


def _client(broker: BrokerProcess) -> httpx.Client:
    return httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=30)


def _holding(data_dir: Path, needle: bytes) -> list[Path]:
    """The files under ``data_dir`` whose bytes contain ``needle``."""
    return [p for p in data_dir.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _publish(broker: BrokerProcess, vhost: str, queue: str, body: bytes) -> None:
    parameters = pika.URLParameters(broker.url.rstrip("/") + "/" + vhost.replace("/", "%2F"))
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


def test_runtime_changes_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with start_broker_process(data_dir, durable_backend="log") as broker, _client(broker) as api:
        assert (
            api.put("/api/users/pete", json={"password": "pw", "tags": "monitoring"}).status_code
            == 201
        )
        assert (
            api.put("/api/vhosts/pv", json={"description": "Pete's", "tags": "a"}).status_code
            == 201
        )
        permissions = {"configure": "^p", "write": ".*", "read": ".*"}
        assert api.put("/api/permissions/pv/pete", json=permissions).status_code == 201
        topic = {"exchange": "amq.topic", "write": "^pete\\.", "read": ".*"}
        assert api.put("/api/topic-permissions/pv/pete", json=topic).status_code == 201
        assert api.put("/api/vhost-limits/pv/max-queues", json={"value": 5}).status_code == 204
        assert api.put("/api/user-limits/pete/max-channels", json={"value": 3}).status_code == 204
        # A vhost whose durable queue holds a persistent message, then deleted.
        assert api.put("/api/vhosts/doomed").status_code == 201
        _publish(broker, "doomed", "kept-on-disk", MARKER)
        assert _holding(data_dir, MARKER), "the message should be on disk before the delete"
        assert api.delete("/api/vhosts/doomed").status_code == 204
        assert _holding(data_dir, MARKER) == []
        exported = api.get("/api/definitions").json()
    assert {
        "value": {"max-queues": 5},
        "vhost": "pv",
        "component": "vhost-limits",
        "name": "limits",
    } in exported["parameters"]

    with start_broker_process(data_dir, durable_backend="log") as broker, _client(broker) as api:
        user = api.get("/api/users/pete").json()
        assert user["tags"] == ["monitoring"]
        assert user["limits"] == {"max-channels": 3}
        assert api.get("/api/permissions/pv/pete").json()["configure"] == "^p"
        assert api.get("/api/topic-permissions/pv/pete").json()[0]["write"] == "^pete\\."
        assert api.get("/api/vhost-limits/pv").json() == [
            {"vhost": "pv", "value": {"max-queues": 5}}
        ]
        vhost = api.get("/api/vhosts/pv").json()
        assert (vhost["description"], vhost["tags"]) == ("Pete's", ["a"])
        assert api.get("/api/vhosts/doomed").status_code == 404
        assert api.get("/api/queues/doomed/kept-on-disk").status_code == 404
        # The runtime user logs in with its password; deleted, it stays deleted.
        credentials = pika.PlainCredentials("pete", "pw")
        parameters = pika.ConnectionParameters(broker.host, broker.port, "pv", credentials)
        pika.BlockingConnection(parameters).close()
        assert api.delete("/api/users/pete").status_code == 204
    with start_broker_process(data_dir, durable_backend="log") as broker, _client(broker) as api:
        assert api.get("/api/users/pete").status_code == 404
        assert api.get("/api/permissions/pv/pete").status_code == 404


def test_vhost_limits_are_imported_from_definitions(tmp_path: Path) -> None:
    """A definitions document's vhost limits (RabbitMQ's ``vhost-limits`` parameter) apply."""
    document = {
        "vhosts": [{"name": "imported"}],
        "parameters": [
            {
                "component": "vhost-limits",
                "name": "limits",
                "vhost": "imported",
                "value": {"max-queues": 1},
            }
        ],
    }
    with start_broker_process(tmp_path / "data") as broker, _client(broker) as api:
        assert api.post("/api/definitions", json=document).status_code in (201, 204)
        assert api.get("/api/vhost-limits/imported").json() == [
            {"vhost": "imported", "value": {"max-queues": 1}}
        ]
