"""The rabbitmqctl-style commands of ``tqbroker-ctl`` over the management API, run as a user
runs them (real processes), against tqbroker and against a real RabbitMQ (the same paths and
JSON, so the same output): ``list``, ``purge``, ``delete``, ``close-connection``,
``export-definitions``/``import-definitions`` and ``status``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.support.polling import eventually

from .brokers import Broker

pytestmark = pytest.mark.timeout(180)


def rows(broker: Broker, kind: str, columns: str) -> list[dict[str, Any]]:
    listed = broker.ctl("list", kind, "--columns", columns, "--format", "json").stdout
    return json.loads(listed)


def test_lists_have_rabbitmqctl_columns(broker: Broker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()
        channel.queue_declare("ctl-q", durable=True)
        channel.exchange_declare("ctl-x", "topic", durable=True)
        channel.queue_bind("ctl-q", "ctl-x", "a.#")
        channel.basic_publish("ctl-x", "a.b", b"one")
        channel.basic_publish("ctl-x", "a.c", b"two")
        channel.queue_declare("ctl-c", exclusive=True)
        channel.basic_consume("ctl-c", lambda *_: None, consumer_tag="ctl-tag")
        # RabbitMQ's management API shows changes after its next statistics round.
        eventually(
            lambda: {"name": "ctl-q", "messages": 2} in rows(broker, "queues", "name,messages"),
            timeout=15,
        )
        queues = broker.ctl("list", "queues").stdout.splitlines()
        assert queues[0].split() == ["name", "messages"]
        assert ["ctl-q", "2"] in [line.split() for line in queues]
        detail = rows(broker, "queues", "name,durable,messages_ready,consumers")
        assert {"name": "ctl-c", "durable": False, "messages_ready": 0, "consumers": 1} in detail
        exchanges = [line.split() for line in broker.ctl("list", "exchanges").stdout.splitlines()]
        assert exchanges[0] == ["name", "type"]
        assert ["ctl-x", "topic"] in exchanges
        bindings = broker.ctl("list", "bindings").stdout.splitlines()
        assert bindings[0].split() == [
            "source_name",
            "source_kind",
            "destination_name",
            "destination_kind",
            "routing_key",
            "arguments",
        ]
        assert ["ctl-x", "exchange", "ctl-q", "queue", "a.#", "{}"] in [
            line.split() for line in bindings
        ]
        eventually(lambda: rows(broker, "connections", "user,state"), timeout=15)
        connections = broker.ctl("list", "connections").stdout.splitlines()
        assert connections[0].split() == ["user", "peer_host", "peer_port", "state"]
        assert connections[1].split()[:2] == ["guest", "127.0.0.1"]
        assert connections[1].split()[3] == "running"
        consumers = broker.ctl("list", "consumers").stdout.splitlines()
        assert consumers[0].split() == [
            "queue_name",
            "channel_pid",
            "consumer_tag",
            "ack_required",
            "prefetch_count",
            "active",
            "arguments",
        ]
        assert rows(broker, "consumers", "queue_name,consumer_tag,ack_required") == [
            {"queue_name": "ctl-c", "consumer_tag": "ctl-tag", "ack_required": True}
        ]
        assert broker.ctl("list", "vhosts").stdout.splitlines() == ["name", "/"]
        wrong = broker.ctl("list", "queues", "--columns", "name,colour", status=2)
        assert "colour" in wrong.stderr
        assert wrong.stderr.count("\n") == 1
    finally:
        connection.close()


def test_purge_delete_and_close_connection(broker: Broker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("ctl-purged", durable=True)
    channel.exchange_declare("ctl-gone", "fanout")
    for n in range(3):
        channel.basic_publish("", "ctl-purged", str(n).encode())
    assert "purged queue 'ctl-purged'" in broker.ctl("purge", "ctl-purged").stdout
    assert channel.queue_declare("ctl-purged", passive=True).method.message_count == 0
    broker.ctl("delete", "queue", "ctl-purged")
    broker.ctl("delete", "exchange", "ctl-gone")
    missing = broker.ctl("delete", "queue", "ctl-purged", status=1)
    assert "404" in missing.stderr
    assert missing.stderr.count("\n") == 1
    with broker.api() as api:
        assert api.get("/api/exchanges/%2F/ctl-gone").status_code == 404
    eventually(lambda: rows(broker, "connections", "name"), timeout=15)
    name = rows(broker, "connections", "name")[0]["name"]
    broker.ctl("close-connection", name, "--reason", "maintenance now")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.process_data_events(time_limit=5)
    assert closed.value.reply_code == 320
    assert "maintenance now" in closed.value.reply_text


def test_definitions_export_and_import(broker: Broker, tmp_path: Path) -> None:
    with broker.api() as api:
        if api.get("/api/definitions").status_code == 404:
            pytest.skip(f"{broker.name} has no GET /api/definitions in this build")
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        connection.channel().queue_declare("ctl-defined", durable=True)
    finally:
        connection.close()
    exported = tmp_path / "definitions.json"
    assert str(exported) in broker.ctl("export-definitions", str(exported)).stdout
    definitions = json.loads(exported.read_text())
    assert "ctl-defined" in [q["name"] for q in definitions["queues"]]
    broker.ctl("delete", "queue", "ctl-defined")
    broker.ctl("import-definitions", str(exported))
    assert {"name": "ctl-defined"} in rows(broker, "queues", "name")
    broker.ctl("import-definitions", str(tmp_path / "absent.json"), status=1)


def test_status(broker: Broker) -> None:
    lines = broker.ctl("status").stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "Node",
        "Product",
        "Listeners",
        "Totals",
        "Messages",
        "Alarms",
    ]
    assert "amqp 127.0.0.1:" in lines[2]
    assert lines[5] == "Alarms: none"
    status = json.loads(broker.ctl("status", "--format", "json").stdout)
    assert status["alarms"] == "none"
    assert "object_totals" in status
