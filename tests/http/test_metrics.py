"""Prometheus metrics over real sockets: ``/metrics`` on the metrics port (not the HTTP API's),
parsed with prometheus-client's own parser, its counters moving under a real pika client's
load; ``/metrics/per-object`` and ``/metrics/detailed``; ``--metrics-port -1``; the message
rates of ``broker/stats.py``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.polling import eventually
from tqbroker.broker import stats
from tqbroker.broker.stats import message_stats
from tqbroker.server.http import metrics
from tqbroker.server.http.metrics_routes import render
from tqbroker.testing import (
    RunningBroker,
    durable_backend_for_tests,
    running_broker,
    start_broker_process,
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base_url: str, path: str = "/metrics") -> Samples:
    """Every sample of a scrape, by (name, sorted labels)."""
    response = httpx.get(base_url + path, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


AMQP = (("protocol", "amqp091"),)
CLASSIC = (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue"))


@pytest.fixture
def connection(tqbroker_thread: RunningBroker) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    yield connection
    if connection.is_open:
        connection.close()


def test_counters_move_under_load(
    tqbroker_thread: RunningBroker, connection: pika.BlockingConnection
) -> None:
    n = 40
    url = tqbroker_thread.metrics_url
    before = scrape(url)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("m.load", durable=True)
    for i in range(n):
        channel.basic_publish("", "m.load", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    channel.basic_publish("", "m.nowhere", b"dropped")
    channel.basic_qos(prefetch_count=n)
    for received, (method, _properties, _body) in enumerate(
        channel.consume("m.load", inactivity_timeout=5), 1
    ):
        assert method is not None
        channel.basic_ack(method.delivery_tag)
        if received == n:
            break
    channel.cancel()

    after: Samples = {}

    def moved(name: str, labels: tuple[tuple[str, str], ...] = AMQP) -> float:
        return after[(name, labels)] - before.get((name, labels), 0)

    def settled() -> bool:
        nonlocal after
        after = scrape(url)
        return moved("rabbitmq_global_messages_acknowledged_total", CLASSIC) == n

    eventually(settled)
    assert moved("rabbitmq_global_messages_received_total") == n + 1
    assert moved("rabbitmq_global_messages_routed_total") == n
    assert moved("rabbitmq_global_messages_unroutable_dropped_total") == 1
    assert moved("rabbitmq_global_messages_confirmed_total") == n + 1
    assert moved("rabbitmq_global_messages_delivered_total", CLASSIC) == n
    assert moved("rabbitmq_global_messages_delivered_consume_manual_ack_total", CLASSIC) == n
    assert after[("rabbitmq_connections", ())] == 1
    assert after[("rabbitmq_channels", ())] == 1
    assert after[("rabbitmq_queue_messages", ())] == 0
    assert after[("rabbitmq_channel_messages_published_total", ())] == n + 1
    assert after[("rabbitmq_connection_incoming_bytes_total", ())] > n
    # The durable queue's persistent messages went through the flusher's fsyncs.
    backend = (("backend", durable_backend_for_tests()),)
    assert after[("tqbroker_fsync_seconds_count", backend)] > 0
    assert after[("tqbroker_group_commit_batch_size_sum", backend)] >= n
    assert after[("tqbroker_backend_healthy", backend)] == 1

    # Totals never go back when the connection closes; the open-channel sums do (as RabbitMQ's).
    connection.close()
    eventually(lambda: scrape(url)[("rabbitmq_connections", ())] == 0)
    closed = scrape(url)
    for name in (
        "rabbitmq_global_messages_received_total",
        "rabbitmq_global_messages_confirmed_total",
    ):
        assert closed[(name, AMQP)] == after[(name, AMQP)]
    assert closed[("rabbitmq_channel_messages_published_total", ())] == 0


def test_per_object_split_and_http_route(
    tqbroker_thread: RunningBroker, connection: pika.BlockingConnection
) -> None:
    channel = connection.channel()
    for name, count in (("m.a", 3), ("m.b", 2)):
        channel.queue_declare(name)
        for _ in range(count):
            channel.basic_publish("", name, b"x")
    connection.process_data_events(0.2)
    # On the metrics port alone, as RabbitMQ serves them (not on the management API's).
    for path in ("/metrics", "/metrics/per-object", "/metrics/detailed"):
        assert httpx.get(tqbroker_thread.http_url + path, timeout=10).status_code == 404
    base = tqbroker_thread.metrics_url
    eventually(lambda: scrape(base)[("rabbitmq_queue_messages_ready", ())] == 5)
    aggregated = scrape(base)
    assert not any(dict(labels).get("queue") for _name, labels in aggregated)
    assert aggregated[("rabbitmq_queues", ())] == 2
    per_object = scrape(base, "/metrics/per-object")
    assert per_object[("rabbitmq_queue_messages_ready", (("queue", "m.a"), ("vhost", "/")))] == 3
    assert per_object[("rabbitmq_queue_messages", (("queue", "m.b"), ("vhost", "/")))] == 2
    assert (
        per_object[("rabbitmq_queue_messages_published_total", (("queue", "m.a"), ("vhost", "/")))]
        == 3
    )
    detailed = scrape(base, "/metrics/detailed?family=queue_coarse_metrics&vhost=%2F")
    assert (
        detailed[("rabbitmq_detailed_queue_messages_ready", (("queue", "m.a"), ("vhost", "/")))]
        == 3
    )
    assert not any(name.startswith("rabbitmq_global") for name, _ in detailed)
    assert scrape(base, "/metrics/detailed?family=queue_coarse_metrics&vhost=other") == {}


def test_per_object_in_pieces_is_one_family_each(
    tqbroker_thread: RunningBroker,
    connection: pika.BlockingConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A family of many queues is rendered in pieces: the text still has each family once,
    every queue in it, as prometheus-client's own rendering of the whole would."""
    monkeypatch.setattr(metrics, "PIECE", 2)
    channel = connection.channel()
    for i in range(5):
        channel.queue_declare(f"m.piece.{i}")
        channel.basic_publish("", f"m.piece.{i}", b"x" * i)
    connection.process_data_events(0.2)
    text = httpx.get(tqbroker_thread.metrics_url + "/metrics/per-object", timeout=10).text
    assert text.count("# HELP rabbitmq_queue_messages_ready_bytes ") == 1
    assert text.count("# TYPE rabbitmq_queue_messages_published_total counter") == 1
    assert tqbroker_thread.broker is not None
    whole = metrics.BrokerCollector(tqbroker_thread.broker, per_object=True).collect()
    assert text.encode() == render(list(whole))
    found = scrape(tqbroker_thread.metrics_url, "/metrics/per-object")
    for i in range(5):
        labels = (("queue", f"m.piece.{i}"), ("vhost", "/"))
        assert found[("rabbitmq_queue_messages_ready_bytes", labels)] == i


def test_stream_offsets_and_group_lag(
    tqbroker_thread: RunningBroker, connection: pika.BlockingConnection
) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("m.stream", durable=True, arguments={"x-queue-type": "stream"})
    for i in range(5):
        channel.basic_publish("", "m.stream", str(i).encode())
    channel.basic_qos(prefetch_count=10)
    arguments = {"x-stream-group": "g1", "x-stream-offset": "first"}
    consumed = channel.consume("m.stream", arguments=arguments, inactivity_timeout=5)
    for acked, (method, _properties, _body) in enumerate(consumed, 1):
        assert method is not None
        channel.basic_ack(method.delivery_tag)
        if acked == 2:
            break
    key = (("queue", "m.stream"), ("vhost", "/"))
    group = (("group", "g1"), ("queue", "m.stream"), ("vhost", "/"))

    def committed() -> bool:
        found = scrape(tqbroker_thread.metrics_url)
        return found.get(("tqbroker_stream_group_committed_offset", group)) == 2

    eventually(committed)
    found = scrape(tqbroker_thread.metrics_url)
    assert found[("tqbroker_stream_log_end_offset", key)] == 5
    assert found[("tqbroker_stream_first_offset", key)] == 0
    assert found[("tqbroker_stream_group_lag", group)] == 3


def test_rates_are_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "SAMPLE_SECONDS", 0.2)
    with running_broker() as broker:
        assert broker.broker is not None
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.queue_declare("m.rate")
        queue = broker.broker.vhosts["/"].queues["m.rate"]

        def publish_rate() -> float:
            """a publish rate above 0"""
            for _ in range(20):
                channel.basic_publish("", "m.rate", b"x")
            connection.process_data_events(0.05)
            rate: float = message_stats(queue.stats).get("publish_details", {}).get("rate", 0.0)
            return rate

        eventually(publish_rate)
        channel.queue_declare("m.rate", passive=True)  # every publish before it is handled
        found = message_stats(broker.broker.stats)
        assert found["publish"] >= 20
        assert found["publish_details"]["rate"] > 0
        # The default exchange took them in and out to the one queue.
        exchange = message_stats(broker.broker.vhosts["/"].exchanges[""].stats)
        assert exchange["publish_in"] == exchange["publish_out"] == found["publish"]
        connection.close()


@pytest.mark.parametrize("port", ["0", "-1"])
def test_metrics_port_option(tmp_path: object, port: str) -> None:
    with start_broker_process(None, extra_args=["--metrics-port", port], cwd=tmp_path) as broker:  # type: ignore[arg-type]
        if port == "-1":
            assert broker.metrics_port is None
            return
        assert broker.metrics_port is not None
        assert broker.http_port is not None
        assert broker.metrics_port != broker.http_port
        found = scrape(broker.metrics_url)
        assert found[("rabbitmq_connections", ())] == 0
        # The metrics port serves the metrics alone.
        assert httpx.get(broker.metrics_url + "/health", timeout=10).status_code == 404
