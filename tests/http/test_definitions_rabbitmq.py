"""Definitions round trip with the real RabbitMQ 3.10 (the oracle; skipped without Debian's
``rabbitmq-server``): a topology declared on RabbitMQ, exported through its management API,
imported into tqbroker (``POST /api/definitions``), exported from tqbroker and imported into the
RabbitMQ vhost emptied meanwhile comes back the same: queues with their arguments, exchanges
with their types and arguments, bindings (exchange to exchange too). The RabbitMQ is the test
session's oracle (``tests/rabbitmq_oracle.py``, started once: ~6-13 s here)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pika

from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker import BrokerConfig
from tqbroker.testing import running_broker

VHOST = "defs-round-trip"
CHECKED = "defs-checked-in"  # each test in a vhost of its own: the oracle node is shared


def declare_topology(url: str) -> None:
    """The topology under test: every exchange type RabbitMQ has built in, arguments of both
    kinds, bindings queue and exchange to exchange, a stream, a transient queue and exchange
    (RabbitMQ exports those too) and an exclusive queue (which it does not)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.exchange_declare(
        "orders", "topic", durable=True, arguments={"alternate-exchange": "unrouted"}
    )
    channel.exchange_declare("unrouted", "fanout", durable=True)
    channel.exchange_declare("audit", "headers", durable=True, internal=True)
    channel.exchange_declare("direct.ad", "direct", durable=True, auto_delete=True)
    channel.exchange_declare("scratch", "direct", durable=False)
    channel.queue_declare(
        "orders.eu",
        durable=True,
        arguments={
            "x-max-length": 1000,
            "x-message-ttl": 3600000,
            "x-dead-letter-exchange": "unrouted",
            "x-dead-letter-routing-key": "dead",
            "x-overflow": "reject-publish",
        },
    )
    channel.queue_declare("prioritised", durable=True, arguments={"x-max-priority": 5})
    channel.queue_declare("lost", durable=True, arguments={"x-queue-mode": "lazy"})
    channel.queue_declare(
        "events", durable=True, arguments={"x-queue-type": "stream", "x-max-age": "7D"}
    )
    channel.queue_declare("short-lived", durable=True, auto_delete=True)
    channel.queue_declare("transient", durable=False)
    channel.queue_bind("orders.eu", "orders", "eu.#")
    channel.queue_bind("prioritised", "direct.ad", "urgent")
    channel.queue_bind("lost", "unrouted", "")
    channel.exchange_bind("audit", "orders", "#")
    channel.queue_bind("lost", "audit", "", arguments={"x-match": "any", "kind": "refund", "n": 3})
    channel.queue_bind("events", "orders", "#")
    channel.queue_bind("transient", "scratch", "t")
    connection.close()


def topology(document: dict[str, Any], vhost: str) -> dict[str, list[str]]:
    """A document's queues, exchanges and bindings in ``vhost``, comparable (sorted; what only
    tqbroker writes left out)."""

    def key(entry: dict[str, Any]) -> str:
        kept = {k: v for k, v in entry.items() if k not in ("vhost", "tqbroker")}
        return json.dumps(kept, sort_keys=True)

    return {
        section: sorted(key(e) for e in document[section] if e.get("vhost", vhost) == vhost)
        for section in ("queues", "exchanges", "bindings")
    }


def only(document: dict[str, Any], vhost: str) -> dict[str, Any]:
    """A whole-broker document reduced to ``vhost`` (users and the other sections kept)."""
    kept = dict(document)
    for section in ("vhosts", "queues", "exchanges", "bindings", "permissions"):
        kept[section] = [e for e in document[section] if e.get("vhost", e.get("name")) == vhost]
    return kept


def durable(document: dict[str, Any]) -> dict[str, Any]:
    """What of a document survives a restart: durable exchanges and queues, bindings between
    them."""
    queues = [q for q in document["queues"] if q["durable"]]
    exchanges = [x for x in document["exchanges"] if x["durable"]]
    kept = {(e.get("vhost"), e["name"]) for e in queues + exchanges}
    bindings = [
        b
        for b in document["bindings"]
        if {(b.get("vhost"), b["source"]), (b.get("vhost"), b["destination"])} <= kept
    ]
    return {"queues": queues, "exchanges": exchanges, "bindings": bindings}


def test_a_rabbitmq_export_imports_and_round_trips_back(
    rabbitmq_oracle: RabbitMQ, tmp_path: Path
) -> None:
    figures: dict[str, float] = {}
    rabbit = httpx.Client(base_url=rabbitmq_oracle.http_url, auth=("guest", "guest"), timeout=30)
    assert rabbit.put(f"/api/vhosts/{VHOST}").status_code in (201, 204)
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    assert rabbit.put(f"/api/permissions/{VHOST}/guest", json=grant).status_code in (201, 204)
    declare_topology(rabbitmq_oracle.url + VHOST)
    started = time.monotonic()
    exported = rabbit.get("/api/definitions")
    figures["RabbitMQ export"] = time.monotonic() - started
    assert exported.status_code == 200
    original = only(exported.json(), VHOST)  # the shared node's other vhosts left out
    assert len(original["queues"]) == 6  # not the exclusive one

    data_dir = tmp_path / "data"
    with running_broker(BrokerConfig(port=0, http_port=0, data_dir=data_dir)) as broker:
        ours = httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=30)
        started = time.monotonic()
        imported = ours.post(
            "/api/definitions",
            content=json.dumps(original),
            headers={"content-type": "application/json"},
        )
        figures["tqbroker import"] = time.monotonic() - started
        assert imported.status_code == 204, imported.text
        assert "users" not in imported.headers["x-definitions-skipped"]  # imported now
        started = time.monotonic()
        ours_exported = ours.get("/api/definitions")
        figures["tqbroker export"] = time.monotonic() - started
        assert ours_exported.status_code == 200
        # The vhost's own export has RabbitMQ's shape too.
        vhost_only = ours.get(f"/api/definitions/{VHOST}").json()
        assert set(vhost_only) == set(rabbit.get(f"/api/definitions/{VHOST}").json())
    document = ours_exported.json()
    assert document["product_name"] == "tqbroker"
    assert topology(document, VHOST) == topology(original, VHOST)

    # Into the RabbitMQ vhost, emptied: it comes back as it was.
    assert rabbit.delete(f"/api/vhosts/{VHOST}").status_code == 204
    started = time.monotonic()
    back = rabbit.post(
        "/api/definitions",
        content=ours_exported.content,
        headers={"content-type": "application/json"},
    )
    figures["RabbitMQ import of ours"] = time.monotonic() - started
    assert back.status_code == 204, back.text
    again = rabbit.get("/api/definitions").json()
    assert topology(again, VHOST) == topology(original, VHOST)

    # tqbroker's own file imports into RabbitMQ too: the durable part of the topology.
    assert rabbit.delete(f"/api/vhosts/{VHOST}").status_code == 204
    stored = (data_dir / "definitions.json").read_bytes()
    back = rabbit.post(
        "/api/definitions", content=stored, headers={"content-type": "application/json"}
    )
    assert back.status_code == 204, back.text
    from_file = rabbit.get("/api/definitions").json()
    assert topology(from_file, VHOST) == topology(durable(original), VHOST)
    assert len(durable(original)["bindings"]) == 6
    assert rabbit.delete(f"/api/vhosts/{VHOST}").status_code == 204
    print("; ".join(f"{what}: {seconds * 1000:.0f} ms" for what, seconds in figures.items()))


def test_the_checked_in_export_is_what_rabbitmq_exports(rabbitmq_oracle: RabbitMQ) -> None:
    """tests/data/rabbitmq-3.10-definitions.json (the default set's stand-in for this module:
    RabbitMQ's ``GET /api/definitions`` after ``declare_topology`` in its vhost ``/``) is what
    RabbitMQ exports for it."""
    rabbit = httpx.Client(base_url=rabbitmq_oracle.http_url, auth=("guest", "guest"), timeout=30)
    assert rabbit.put(f"/api/vhosts/{CHECKED}").status_code in (201, 204)
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    assert rabbit.put(f"/api/permissions/{CHECKED}/guest", json=grant).status_code in (201, 204)
    try:
        declare_topology(rabbitmq_oracle.url + CHECKED)
        exported = rabbit.get("/api/definitions").json()
    finally:
        rabbit.delete(f"/api/vhosts/{CHECKED}")
    data = Path(__file__).parent.parent / "data" / "rabbitmq-3.10-definitions.json"
    checked_in = json.loads(data.read_text())
    assert topology(exported, CHECKED) == topology(checked_in, "/")
    assert set(exported) == set(checked_in)
