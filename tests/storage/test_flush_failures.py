"""What publishers and consumers see when the durable backend's flushes fail or must wait."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pika
import pytest

from tests.support.rawamqp import RawAMQP, body_frame, content_header
from tqbroker.backends.log import segment as segment_module
from tqbroker.backends.log import store as store_module
from tqbroker.config import BrokerConfig
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.frames import encode_method
from tqbroker.protocol.methods import (
    BasicAck,
    BasicNack,
    BasicProperties,
    BasicPublish,
    ConfirmSelect,
    ConfirmSelectOk,
    QueueDeclare,
    QueueDeclareOk,
)
from tqbroker.testing import running_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)
# These tests patch the log backend's internals: their queues are on it whatever the default.
ON_LOG = {"x-queue-backend": "log"}


def test_failed_fdatasync_nacks_and_no_later_publish_is_acked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as b:
        ch = pika.BlockingConnection(pika.URLParameters(b.url)).channel()
        ch.confirm_delivery()
        ch.queue_declare("d", durable=True, arguments=ON_LOG)
        ch.basic_publish("", "d", b"before", PERSISTENT)  # acked: the disk works

        real_sync = segment_module.Segment.sync

        def failing_sync(self: segment_module.Segment, *, indexes: bool = True) -> None:
            raise OSError(errno.EIO, "injected I/O error")

        monkeypatch.setattr(segment_module.Segment, "sync", failing_sync)
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "d", b"during", PERSISTENT)
        # The disk "recovers", but a retried fsync proves nothing: still refused.
        monkeypatch.setattr(segment_module.Segment, "sync", real_sync)
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "d", b"after", PERSISTENT)
        # Everything else keeps working: transient queues, reading the durable one.
        ch.queue_declare("t")
        ch.basic_publish("", "t", b"memory")
        assert ch.basic_get("t", auto_ack=True)[2] == b"memory"
        assert ch.basic_get("d", auto_ack=True)[2] == b"before"


def test_basic_get_waits_for_the_flush_that_extends_the_delivery_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log backend only delivers within a durably reserved window; basic.get past it is
    answered after the flush that extends it, never with a wrong get-empty."""
    monkeypatch.setattr(store_module, "RESERVE_WINDOW", 4)
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as b:
        ch = pika.BlockingConnection(pika.URLParameters(b.url)).channel()
        ch.queue_declare("w", durable=True, arguments=ON_LOG)
        for i in range(50):
            ch.basic_publish("", "w", b"%d" % i, PERSISTENT)
        bodies = []
        while True:
            method, _props, body = ch.basic_get("w", auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        assert bodies == [b"%d" % i for i in range(50)]


def test_tx_commit_ok_waits_for_the_fsync_and_fails_the_channel_if_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_sync = segment_module.Segment.sync

    def slow_sync(self: segment_module.Segment, *, indexes: bool = True) -> None:
        time.sleep(0.5)
        real_sync(self, indexes=indexes)

    monkeypatch.setattr(segment_module.Segment, "sync", slow_sync)
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as b:
        ch = pika.BlockingConnection(pika.URLParameters(b.url)).channel()
        ch.queue_declare("tx", durable=True, arguments=ON_LOG)
        ch.tx_select()
        ch.basic_publish("", "tx", b"committed", PERSISTENT)
        started = time.monotonic()
        ch.tx_commit()
        assert time.monotonic() - started >= 0.4  # commit-ok came after the fsync

        def failing_sync(self: segment_module.Segment, *, indexes: bool = True) -> None:
            raise OSError(errno.EIO, "injected I/O error")

        monkeypatch.setattr(segment_module.Segment, "sync", failing_sync)
        ch.basic_publish("", "tx", b"lost", PERSISTENT)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as failed:
            ch.tx_commit()
        assert failed.value.reply_code == 541


def test_basic_get_on_a_failed_backend_answers_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its delivery window a queue needs a flush before basic.get can hand out more; on a
    backend whose fsync failed that flush never comes, so the answer is get-empty, not silence."""
    monkeypatch.setattr(store_module, "RESERVE_WINDOW", 4)
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as b:
        ch = pika.BlockingConnection(pika.URLParameters(b.url)).channel()
        ch.confirm_delivery()
        ch.queue_declare("g", durable=True, arguments=ON_LOG)
        for i in range(20):
            ch.basic_publish("", "g", b"%d" % i, PERSISTENT)

        def failing_sync(self: segment_module.Segment, *, indexes: bool = True) -> None:
            raise OSError(errno.EIO, "injected I/O error")

        monkeypatch.setattr(segment_module.Segment, "sync", failing_sync)
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "g", b"refused", PERSISTENT)
        started = time.monotonic()
        bodies = []
        while True:
            method, _props, body = ch.basic_get("g", auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        assert time.monotonic() - started < 10
        assert bodies == [b"%d" % i for i in range(len(bodies))]  # in order, then get-empty
        assert len(bodies) < 20  # the window ran out: the rest waits for a healthy backend


def _stream_burst(host: str, port: int, count: int) -> tuple[list[BasicAck | BasicNack], bool]:
    """``count`` persistent publishes to the stream "s" in one write on a confirm channel:
    every ack and nack until all are settled (and whether a socket error ended it)."""
    with RawAMQP(host, port, timeout=10) as amqp:
        amqp.handshake()
        amqp.open_channel(1)
        amqp.call(1, ConfirmSelect(False), ConfirmSelectOk)
        amqp.call(1, QueueDeclare(queue="s", durable=True, arguments=STREAM), QueueDeclareOk)
        publish = BasicPublish(0, "", "s", False, False)
        props = BasicProperties(delivery_mode=2).encode()
        amqp.send(
            b"".join(
                encode_method(1, publish)
                + content_header(1, 9, props)
                + body_frame(1, b"m%08d" % n)
                for n in range(count)
            )
        )
        settled, replies = 0, []
        while settled < count:
            method = amqp.next_frame(timeout=10).method
            if isinstance(method, BasicAck | BasicNack):
                replies.append(method)
                settled = max(settled, method.delivery_tag)
        return replies, False


STREAM: FieldTable = {"x-queue-type": "stream"}


def test_a_stream_batch_is_confirmed_and_nacked_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishes that land in one record batch share one flush ticket: they are acked together
    (with ``multiple``), and when the flush fails, nacked together; never one acked and the
    next of its batch nacked."""
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as b:
        replies, _ = _stream_burst(b.host, b.port, 200)
        assert all(isinstance(r, BasicAck) for r in replies)
        assert replies[-1].delivery_tag == 200
        assert len(replies) < 20, "a confirm per publish: the batch did not share its ticket"

        def failing_sync(self: segment_module.Segment, *, indexes: bool = True) -> None:
            raise OSError(errno.EIO, "injected I/O error")

        monkeypatch.setattr(segment_module.Segment, "sync", failing_sync)
        replies, _ = _stream_burst(b.host, b.port, 200)
        assert all(isinstance(r, BasicNack) for r in replies), replies
        assert replies[-1].delivery_tag == 200
        tags = [r.delivery_tag for r in replies]
        assert tags == sorted(tags)
        assert all(r.multiple for r in replies[1:] if r.delivery_tag > 1)
