"""One broker per data directory: a second one on the same ``--data-dir`` (other ports) is refused
with one line and changes nothing; the lock goes with its holder, kill -9 included; embedded
brokers take it too (two in one process on one directory conflict)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pika
import pytest
import trio

import tqbroker
from tqbroker.dirlock import LOCK_FILE, DataDirInUse, DataDirLock
from tqbroker.testing import BrokerProcess, start_broker_process

pytestmark = pytest.mark.timeout(120)


def tree(directory: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under ``directory``: its bytes (None for a directory) and mtime."""
    return {
        str(path.relative_to(directory)): (
            None if path.is_dir() else path.read_bytes(),
            path.stat().st_mtime_ns,
        )
        for path in sorted(directory.rglob("*"))
    }


def start_second(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tqbroker`` on ``data_dir`` with ephemeral ports and the CLI's log level."""
    command = [sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "0"]
    command += ["--metrics-port", "0", "--data-dir", str(data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def publish(broker: BrokerProcess, queue: str, body: bytes) -> None:
    """``body`` on the durable ``queue``, confirmed (so stored)."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


def get(broker: BrokerProcess, queue: str) -> bytes | None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    body = connection.channel().basic_get(queue, auto_ack=True)[2]
    connection.close()
    assert body is None or isinstance(body, bytes)
    return body


def test_a_second_broker_on_the_same_directory_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with start_broker_process(data_dir) as first:
        publish(first, "q", b"stored")  # queue files, definitions, users: all there
        assert (data_dir / LOCK_FILE).read_text() == f"{first.proc.pid}\n"
        # Frozen, the holder writes nothing meanwhile: any change would be the second's.
        first.proc.send_signal(signal.SIGSTOP)
        try:
            before = tree(data_dir)
            second = start_second(data_dir)
            after = tree(data_dir)
        finally:
            first.proc.send_signal(signal.SIGCONT)
        assert second.returncode == 1
        assert second.stdout == ""
        assert second.stderr.splitlines() == [
            f"tqbroker: cannot start: the data directory {data_dir} is in use by another "
            f"broker (PID {first.proc.pid}); each broker needs a data directory of its own"
        ]
        assert after == before
        assert get(first, "q") == b"stored"  # the holder goes on serving


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = start_broker_process(data_dir)
    publish(first, "q", b"kept")
    first.kill()
    assert (data_dir / LOCK_FILE).read_text() == f"{first.proc.pid}\n"  # stale: no matter
    with start_broker_process(data_dir) as restarted:
        assert (data_dir / LOCK_FILE).read_text() == f"{restarted.proc.pid}\n"
        assert get(restarted, "q") == b"kept"
        assert start_second(data_dir).returncode == 1  # and it holds the lock now
    assert (data_dir / LOCK_FILE).read_bytes() == b""  # a clean stop empties it


def test_two_locks_in_one_process_conflict(tmp_path: Path) -> None:
    """flock locks belong to open file descriptions: a second open in the same process is
    refused as another process would be, and the refusal leaves the file as it was."""
    first = DataDirLock(tmp_path)
    with pytest.raises(DataDirInUse) as refused:
        DataDirLock(tmp_path)
    assert refused.value.pid == os.getpid()
    assert refused.value.path == tmp_path.absolute()
    assert "another broker in this process" in str(refused.value)
    assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    first.release()
    first.release()  # idempotent
    second = DataDirLock(tmp_path)
    assert second.held
    second.release()
    assert not second.held


@pytest.mark.parametrize("durable_backend", ["log", "memory"])
async def test_two_embedded_brokers_on_one_directory(tmp_path: Path, durable_backend: str) -> None:
    """The second ``serve`` in one process raises ``tqbroker.DataDirInUse``; once the first
    stops, the lock is free again (a broker with no durable store takes it as well)."""
    config = tqbroker.BrokerConfig(
        port=0, http_port=None, data_dir=tmp_path, durable_backend=durable_backend
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(tqbroker.serve, config)
        with pytest.RaisesGroup(
            pytest.RaisesExc(tqbroker.DataDirInUse, match="in this process"), flatten_subgroups=True
        ):
            async with trio.open_nursery() as second:
                await second.start(tqbroker.serve, config)
        nursery.cancel_scope.cancel()
    assert (tmp_path / LOCK_FILE).read_bytes() == b""
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(tqbroker.serve, config)
        assert listening.amqp
        nursery.cancel_scope.cancel()
