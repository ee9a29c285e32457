"""Storage errors other than a failed fdatasync fail only the operation that met them, with a
clear reply: running out of file descriptors nacks the publish that met it alone (a declare
creates no file: a new queue's first write does), never poisons the backend, and leaks no
descriptor; a delete that storage
refuses leaves the queue whole, in memory and on disk.

Probe of the issue: one user declaring durable queues until descriptors ran out made every
persistent publish in the broker nacked until a restart, and each failed declare leaked 2-3
descriptors; a ``queue.delete`` meeting EMFILE dropped the socket and the deleted queue came
back after a restart."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx
import pika
import pytest

from tqbroker.backends.log import LogBackend
from tqbroker.config import BrokerConfig
from tqbroker.storage_env import FileSystem, StorageEnv
from tqbroker.storage_env.fsio import StrPath
from tqbroker.testing import running_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)
ON_LOG = {"x-queue-backend": "log"}


def fds_under(root: Path) -> int:
    """This process's descriptors of files under ``root``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(root))
        except OSError:
            continue
    return count


class OutOfDescriptors(FileSystem):
    """Every file created under a queue's directory meets EMFILE while ``failing``."""

    failing = False

    def open(self, path: StrPath, flags: int, mode: int = 0o777) -> int:
        if self.failing and flags & os.O_CREAT and "/log/" in str(path):
            raise OSError(errno.EMFILE, "Too many open files")
        return super().open(path, flags, mode)


def test_running_out_of_descriptors_fails_the_first_publish_alone(tmp_path: Path) -> None:
    """(The file-handle cache makes this rare: its own idle descriptors are closed first, see
    ``test_file_cache.py``; here nothing it holds could help.) A declare creates no file (a new
    queue's are created by its first write, on the publish path): what meets EMFILE is the first
    publish to it, refused (nacked) alone; the backend is never poisoned, so /health stays 200
    and the next publish, once descriptors are back, is confirmed at once."""
    facade = OutOfDescriptors()
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path)
    with running_broker(config, env=StorageEnv.default(facade)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("kept", durable=True, arguments=ON_LOG)
        channel.basic_publish("", "kept", b"before", PERSISTENT)

        facade.failing = True
        before = fds_under(tmp_path)
        for n in range(20):  # none leaks a descriptor
            channel.queue_declare(f"more{n}", durable=True, arguments=ON_LOG)
            with pytest.raises(pika.exceptions.NackError):
                channel.basic_publish("", f"more{n}", b"refused", PERSISTENT)
        assert fds_under(tmp_path) == before
        assert httpx.get(f"{broker.http_url}/health").status_code == 200
        facade.failing = False

        channel.basic_publish("", "more0", b"after", PERSISTENT)
        channel.basic_publish("", "kept", b"after", PERSISTENT)
        channel.queue_declare("fits-again", durable=True, arguments=ON_LOG)
        assert channel.queue_declare("more0", passive=True).method.message_count == 1
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
