"""The oracle for ``rabbitmq_replies.json``: start a real RabbitMQ on loopback, run every case of
``reply_cases`` against it and diff with the checked-in table, so that the table
``test_reply_texts.py`` holds tqbroker to is what RabbitMQ really says; and a quorum queue's
delivery limit counted as RabbitMQ counts it.

Slow (a RabbitMQ node starts: ~15 s); needs Debian's ``rabbitmq-server`` package. To refresh the
table after adding a case: ``python tests/compat/reply_cases.py PORT > tests/compat/
rabbitmq_replies.json`` against a RabbitMQ on PORT (this test prints the diff it finds).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tqbroker.testing import running_broker

from .reply_cases import capture_table, load_table
from .test_quorum_queues import QUORUM, returns_until_gone

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SERVER = "/usr/sbin/rabbitmq-server"
CTL = "/usr/sbin/rabbitmqctl"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (os.path.exists(SERVER) and os.path.exists(CTL)),
        reason="needs RabbitMQ (Debian package rabbitmq-server)",
    ),
]


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[tuple[str, int]]:
    sys.path.insert(0, str(BENCHMARKS))
    from targets import Epmd, RabbitMQTarget

    # Not under pytest's tmp_path: its parents are private to us, and Debian's script runs the
    # node as the rabbitmq user when started by root.
    parent = Path(tempfile.mkdtemp(prefix="tqbroker-oracle-"))
    root = parent / "node"
    root.mkdir()
    if os.geteuid() == 0:
        for path in (parent, root):
            shutil.chown(path, "rabbitmq")
    epmd = Epmd()
    target = RabbitMQTarget(root, SERVER, CTL, epmd=epmd)
    try:
        target.start()
        yield "127.0.0.1", target.port
    finally:
        target.close()
        epmd.cleanup()
        shutil.rmtree(parent, ignore_errors=True)


def test_the_table_is_what_rabbitmq_says(rabbitmq: tuple[str, int]) -> None:
    captured = capture_table(*rabbitmq)
    table = load_table()
    assert captured["capabilities"] == table["capabilities"]
    differ = {
        name: {"rabbitmq": answer, "table": table["replies"].get(name)}
        for name, answer in captured["replies"].items()
        if answer != table["replies"].get(name)
    }
    assert not differ, f"rabbitmq_replies.json differs from RabbitMQ: {differ}"


def delivery_limit_run(host: str, port: int, limit: dict[str, int]) -> tuple[int, int, str]:
    """On a quorum queue with ``limit`` and a dead-letter queue: how many times a nacked
    message is delivered, how many times with x-delivery-limit 2 and no dead-lettering, and
    the x-death reason the dead-lettered copy carries."""
    params = pika.ConnectionParameters(host, port)
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        for queue in ("c.dl.work", "c.dl.dlq", "c.dl.two"):
            ch.queue_delete(queue)
        ch.queue_declare("c.dl.dlq", durable=True)
        dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "c.dl.dlq"}
        ch.queue_declare("c.dl.work", durable=True, arguments={**QUORUM, **dead_letter, **limit})
        ch.queue_declare("c.dl.two", durable=True, arguments={**QUORUM, "x-delivery-limit": 2})
        ch.confirm_delivery()
        ch.basic_publish("", "c.dl.work", b"x")
        ch.basic_publish("", "c.dl.two", b"x")
        delivered = returns_until_gone(ch, "c.dl.work", 30)
        two = returns_until_gone(ch, "c.dl.two", 10)
        for _ in range(50):  # RabbitMQ dead-letters asynchronously
            method, properties, _ = ch.basic_get("c.dl.dlq", auto_ack=True)
            if method is not None:
                break
            time.sleep(0.1)
        reason = (properties.headers or {}).get("x-first-death-reason") if method else None
        for queue in ("c.dl.work", "c.dl.dlq", "c.dl.two"):
            ch.queue_delete(queue)
        return delivered, two, str(reason)


def test_delivery_limit_counts_as_rabbitmq(rabbitmq: tuple[str, int]) -> None:
    """RabbitMQ 3.10 has no default limit: it is given 20 (RabbitMQ 4.0's default) explicitly,
    tqbroker none."""
    with running_broker() as broker:
        ours = delivery_limit_run(broker.host, broker.port, {})
    assert ours == delivery_limit_run(*rabbitmq, {"x-delivery-limit": 20})
    assert ours == (21, 3, "delivery_limit")
