"""A long transient backlog keeps the broker's memory bounded: past each queue's in-memory window
(``page_window``, 100k by default) further messages are paged out to disk and cost no memory;
they come back in order.

Probe of the issue: 2M transient 1 KiB messages to a queue without consumers took the broker
from 68 to 2,590 MB (1,322 B per message), with no alarm."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.support.polling import eventually
from tests.support.rawamqp import RawAMQP
from tqbroker.protocol.methods import QueueDeclare, QueueDeclareOk
from tqbroker.testing import BrokerProcess, start_broker_process

BODY = b"t" * 1024


def resident(broker: BrokerProcess) -> int:
    with open(f"/proc/{broker.proc.pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def publish(broker: BrokerProcess, count: int, start: int) -> None:
    """``count`` transient messages numbered from ``start``, then wait until they are queued."""
    with RawAMQP(broker.host, broker.port) as amqp:
        amqp.handshake()
        amqp.open_channel(1)
        for n in range(start, start + count):
            amqp.publish(1, "", "backlog", b"%09d" % n + BODY[9:])
        eventually(  # a passive declare answers after the publishes before it
            lambda: (
                amqp.call(
                    1, QueueDeclare(queue="backlog", passive=True), QueueDeclareOk
                ).message_count
                >= start + count
            ),
            timeout=60,
        )


def run_backlog(
    tmp_path: Path, window: int, total: int, warm_up: int | None = None
) -> tuple[float, int]:
    """Bytes of resident memory per message queued after the first ``warm_up`` (by default
    twice the window: it is full, and paging out has begun), and the messages consumed back
    (checked in order)."""
    config = tmp_path / "broker.toml"
    config.write_text(f"[backend_options.memory]\npage_window = {window}\n")
    with start_broker_process(
        tmp_path / "data", extra_args=["--config", str(config), "--memory-high-watermark", "0.9"]
    ) as broker:
        # No heartbeats: this connection stays idle while the backlog is published.
        connection = pika.BlockingConnection(pika.URLParameters(broker.url + "?heartbeat=0"))
        channel = connection.channel()
        channel.queue_declare("backlog")
        first = 2 * window if warm_up is None else warm_up
        publish(broker, first, 0)
        before = resident(broker)
        publish(broker, total - first, first)
        per_message = (resident(broker) - before) / (total - first)
        channel.basic_qos(prefetch_count=2000)
        seen = 0
        for method, _props, body in channel.consume("backlog", auto_ack=True):
            assert method is not None
            assert int(body[:9]) == seen, f"out of order at {seen}"
            seen += 1
            if seen == total:
                break
        channel.cancel()
        connection.close()
        return per_message, seen


def test_a_transient_backlog_past_the_window_costs_no_memory(tmp_path: Path) -> None:
    per_message, consumed = run_backlog(tmp_path, window=2000, total=60_000)
    assert per_message < 150, f"{per_message:.0f} B of memory per paged-out message"
    assert consumed == 60_000


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_ten_million_message_transient_backlog(tmp_path: Path) -> None:
    """The issue's bound with the default window: 10M 1 KiB messages, < 150 B each past it."""
    per_message, consumed = run_backlog(tmp_path, window=100_000, total=10_000_000)
    print(f"{per_message:.1f} B of resident memory per message past the window")
    assert per_message < 150
    assert consumed == 10_000_000
