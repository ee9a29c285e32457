"""The definitions file is assembled from pre-encoded parts
(``definitions_snapshot.encode_snapshot``): each queue's entry is encoded once and joined with
the others. What it writes must be the RabbitMQ definitions JSON the plain structure would be,
whatever the counts."""

from __future__ import annotations

import json
from pathlib import Path

import pika

from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker


def test_three_hundred_durable_queues_survive_a_restart(tmp_path: Path) -> None:
    """300 queues, one deleted and one declared after the first encoding (the cached entries of
    the others are reused)."""
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path)
    with running_broker(config) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.exchange_declare("x", "direct", durable=True)
        for n in range(300):
            channel.queue_declare(f"q{n}", durable=True, arguments={"x-max-length": n + 1})
        channel.queue_bind("q7", "x", routing_key="seven")
        channel.queue_delete("q3")
        channel.queue_declare("late", durable=True)
        connection.close()
    stored = json.loads((tmp_path / "definitions.json").read_bytes())
    queues = {q["name"]: q for q in stored["queues"] if q["vhost"] == "/"}
    assert set(queues) == {f"q{n}" for n in range(300) if n != 3} | {"late"}
    assert queues["q9"]["arguments"] == {"x-max-length": 10}
    with running_broker(config) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        for n in (0, 150, 299):
            channel.queue_declare(f"q{n}", passive=True)
        channel.basic_publish("x", "seven", b"routed")
        _method, _props, body = channel.basic_get("q7", auto_ack=True)
        assert body == b"routed"
        connection.close()
