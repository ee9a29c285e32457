"""Crash cases the queue model (``test_queue_model.py``) found or builds too rarely, pinned:
each a broker process killed with SIGKILL and restarted on the same data directory
(``queue_model.ModelBroker``)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pika
import pytest

from tests.support.queue_model import ForkServer, ModelBroker


@pytest.mark.parametrize("persistent", [False, True])
def test_log_fresh_message_after_crash(
    tmp_path: Path, fork_server: ForkServer, persistent: bool
) -> None:
    """The minimal case the model found: declare, kill -9, restart, publish, get."""
    broker = ModelBroker("log", tmp_path / "data", fork_server)
    try:
        conn = broker.connect()
        conn.channel().queue_declare("q", durable=True, arguments={"x-queue-backend": "log"})
        broker.kill()
        broker.start()
        with closing(broker.connect()) as conn:
            ch = conn.channel()
            props = pika.BasicProperties(delivery_mode=2 if persistent else 1)
            ch.basic_publish("", "q", b"never delivered", props)
            method, _props, _body = ch.basic_get("q")
        assert method is not None
        assert not method.redelivered
    finally:
        broker.close()


@pytest.mark.parametrize("backend", ["log", "rocksdb"])
def test_ack_durable_after_later_confirm(
    tmp_path: Path, fork_server: ForkServer, backend: str
) -> None:
    """The model's narrowest crash rule, pinned: an ack is durable once a persistent publish sent
    after it was confirmed (its flush covers the ack), so a crash must not bring it back. (The
    random model rarely builds this exact sequence: a mutant that never checkpoints acks on the
    log backend survived 200 examples.)"""
    broker = ModelBroker(backend, tmp_path / "data", fork_server)
    try:
        conn = broker.connect()
        ch = conn.channel()
        ch.queue_declare("q", durable=True, arguments={"x-queue-backend": backend})
        ch.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2)
        ch.basic_publish("", "q", b"acked", persistent)
        method, _props, _body = ch.basic_get("q")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        ch.basic_publish("", "q", b"kept", persistent)  # confirmed: covers the ack
        broker.kill()
        broker.start()
        with closing(broker.connect()) as conn:
            ch = conn.channel()
            method, _props, body = ch.basic_get("q", auto_ack=True)
            assert method is not None  # (flagged redelivered or not: the crash window)
            assert body == b"kept"
            assert ch.basic_get("q")[0] is None
    finally:
        broker.close()
