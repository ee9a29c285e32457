"""Embedding the broker in a Trio application."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pika
import pytest
import trio

import tqbroker
from tqbroker.testing import RunningBroker


async def test_serve_returns_bound_addresses(tmp_path: Path) -> None:
    config = tqbroker.BrokerConfig(port=0, http_port=0, data_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(tqbroker.serve, config)
        host, port = listening.amqp[0]
        assert host == "127.0.0.1"
        assert port > 0
        assert listening.http[0][0] == "127.0.0.1"
        assert listening.http[0][1] > 0
        # The metrics port follows the HTTP API's: ephemeral too, never RabbitMQ's 15692.
        assert config.metrics_port == 0
        assert listening.metrics[0][1] not in (0, 15692, listening.http[0][1])
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"AMQP\x00\x00\x09\x01")
        start = await stream.receive_some(4096)
        assert start[:1] == b"\x01"  # a method frame: connection.start
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_pytest_trio_fixture(tqbroker_broker: RunningBroker) -> None:
    def publish_and_get() -> bytes:
        conn = pika.BlockingConnection(pika.URLParameters(tqbroker_broker.url))
        ch = conn.channel()
        ch.queue_declare("fixture")
        ch.basic_publish("", "fixture", b"from a thread")
        body = ch.basic_get("fixture", auto_ack=True)[2]
        conn.close()
        return body

    assert await trio.to_thread.run_sync(publish_and_get) == b"from a thread"


async def test_graceful_shutdown_event(tmp_path: Path) -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(
            lambda task_status: tqbroker.serve(
                tqbroker.BrokerConfig(port=0, http_port=None, data_dir=tmp_path),
                shutdown=shutdown,
                task_status=task_status,
            )
        )
        host, port = listening.amqp[0]
        assert listening.http == listening.metrics == []  # no HTTP API: no metrics port either
        connected = trio.Event()

        def connect_and_wait() -> int:
            conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
            trio.from_thread.run_sync(connected.set)  # open: the broker holds the connection
            try:
                conn.process_data_events(time_limit=10)
            except pika.exceptions.ConnectionClosedByBroker as exc:
                return int(exc.reply_code)
            return 0

        async with trio.open_nursery() as clients:
            codes: list[int] = []

            async def client() -> None:
                codes.append(await trio.to_thread.run_sync(connect_and_wait))

            clients.start_soon(client)
            await connected.wait()
            shutdown.set()
        assert codes == [320]
    # serve returned by itself: the nursery exited without being cancelled


@pytest.mark.parametrize(("http_port", "expected"), [(0, 0), (None, None), (8080, 15692)])
def test_the_metrics_port_follows_the_http_port(
    http_port: int | None, expected: int | None
) -> None:
    assert tqbroker.BrokerConfig(port=0, http_port=http_port).metrics_port == expected


def test_a_given_metrics_port_wins() -> None:
    assert tqbroker.BrokerConfig(http_port=0, metrics_port=15692).metrics_port == 15692
    assert tqbroker.BrokerConfig(http_port=None, metrics_port=0).metrics_port == 0
    assert tqbroker.BrokerConfig(http_port=0, metrics_port=None).metrics_port is None


def test_the_command_line_defaults_still_bind_rabbitmqs_ports(tmp_path: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "tqbroker", "--print-config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert {"port = 5672", "http_port = 15672", "metrics_port = 15692"} <= set(shown)
