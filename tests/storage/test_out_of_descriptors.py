"""Storage errors other than a failed fdatasync fail only the operation that met them, with a
clear reply: running out of file descriptors closes the declaring channel with 506, never
poisons the backend (persistent publishes elsewhere are still confirmed), and leaks no
descriptor; a delete that storage refuses leaves the queue whole, in memory and on disk.

Probe of the issue: one user declaring durable queues until descriptors ran out made every
persistent publish in the broker nacked until a restart, and each failed declare leaked 2-3
descriptors; a ``queue.delete`` meeting EMFILE dropped the socket and the deleted queue came
back after a restart."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import httpx
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.backends.log import LogBackend
from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker, start_broker_process

PERSISTENT = pika.BasicProperties(delivery_mode=2)
ON_LOG = {"x-queue-backend": "log"}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def declare_until_refused(
    channel: BlockingChannel,
) -> tuple[int, pika.exceptions.ChannelClosedByBroker]:
    """Declare durable queues q0, q1... until refused; how many were declared, and the refusal."""
    for n in range(100):
        try:
            channel.queue_declare(f"q{n}", durable=True, arguments=ON_LOG)
        except pika.exceptions.ChannelClosedByBroker as refused:
            return n, refused
    raise AssertionError("never refused")


def test_running_out_of_descriptors_fails_the_declare_alone(tmp_path: Path) -> None:
    with start_broker_process(tmp_path / "data", stderr=tmp_path / "broker.log") as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("kept", durable=True, arguments=ON_LOG)
        channel.basic_publish("", "kept", b"before", PERSISTENT)
        pid = broker.proc.pid
        limit = open_fds(pid) + 32 + 60  # the broker keeps 32 in reserve; 60 for queues
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))

        declared, refused = declare_until_refused(channel)
        assert refused.reply_code == 506
        assert "Too many open files" in refused.reply_text
        assert "kept for connections" in refused.reply_text  # the reserve, not the wall
        assert 10 < declared < 40

        before = open_fds(pid)
        for n in range(20):  # each fails; none leaks a descriptor
            failing = connection.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                failing.queue_declare(f"more{n}", durable=True, arguments=ON_LOG)
        assert open_fds(pid) == before

        # The backend is not poisoned: a persistent publish to another queue is confirmed...
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", "kept", b"after", PERSISTENT)
        # ...deletes work and give descriptors back, and /health is 200.
        for n in range(declared):
            channel.queue_delete(f"q{n}")
        channel.queue_declare("fits-again", durable=True, arguments=ON_LOG)
        assert httpx.get(f"{broker.http_url}/health").status_code == 200
        connection.close()


def test_a_delete_that_storage_refuses_leaves_the_queue_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path)
    real_delete = LogBackend.delete_queue

    def out_of_descriptors(self: LogBackend, vhost: str, queue: str) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    with running_broker(config) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("d", durable=True, arguments=ON_LOG)
        channel.basic_publish("", "d", b"kept", PERSISTENT)
        monkeypatch.setattr(LogBackend, "delete_queue", out_of_descriptors)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_delete("d")
        assert refused.value.reply_code == 506
        assert "cannot delete queue 'd'" in refused.value.reply_text
        assert connection.is_open  # a channel error, not a dropped socket
        channel = connection.channel()
        assert channel.queue_declare("d", passive=True).method.message_count == 1
        connection.close()
    monkeypatch.setattr(LogBackend, "delete_queue", real_delete)

    with running_broker(config) as broker:  # after a restart: still there, message and all
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        _method, _props, body = channel.basic_get("d", auto_ack=True)
        assert body == b"kept"
        assert channel.queue_delete("d").method.message_count == 0
        connection.close()
    with running_broker(config) as broker:  # deleted for good
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            connection.channel().queue_declare("d", passive=True)
        assert missing.value.reply_code == 404
