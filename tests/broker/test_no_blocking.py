"""Nothing blocks the broker's Trio thread: every fsync and fdatasync (definitions writes, queue
deletes, recovery, flushes, shutdown) runs in a worker thread.

An in-process broker with ``os.fsync`` and ``os.fdatasync`` wrapped to record the calling
thread; a pika client (in a worker thread) declares, binds, publishes with confirms, unbinds and
deletes durable topology, then the broker restarts on the same data directory and the client
declares and consumes again.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pika
import pika.exceptions
import pytest
import trio
from pika.adapters.blocking_connection import BlockingConnection

from tqbroker.broker.definitions_file import DEFINITIONS_FILE
from tqbroker.config import BrokerConfig
from tqbroker.storage_env import StorageEnv
from tqbroker.testing import RunningBroker, start_broker

pytestmark = pytest.mark.timeout(60)


class SyncCalls:
    """Which threads called ``os.fsync``/``os.fdatasync`` (and where, for the Trio thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trio_thread = threading.get_ident()
        self.on_trio: list[str] = []
        self.in_workers = 0
        self._lock = threading.Lock()
        for name in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name: str, real: Callable[[int], None]) -> Callable[[int], None]:
        def wrapper(fd: int) -> None:
            with self._lock:
                if threading.get_ident() == self.trio_thread:
                    self.on_trio.append(f"{name}:\n{''.join(traceback.format_stack(limit=8))}")
                else:
                    self.in_workers += 1
            real(fd)

        return wrapper


def _connect(broker: RunningBroker) -> BlockingConnection:
    params = pika.URLParameters(broker.url)
    params.socket_timeout = 10
    return BlockingConnection(params)


def _first_run(broker: RunningBroker) -> None:
    with _connect(broker) as connection:
        ch = connection.channel()
        ch.confirm_delivery()
        ch.exchange_declare("nb.x", "topic", durable=True)
        ch.exchange_declare("nb.gone", "fanout", durable=True)
        delayed = {"x-delayed-type": "direct"}
        ch.exchange_declare("nb.delay", "x-delayed-message", durable=True, arguments=delayed)
        ch.exchange_declare("nb.delay2", "x-delayed-message", durable=True, arguments=delayed)
        ch.exchange_bind("nb.x", "nb.gone", routing_key="")
        ch.queue_declare("nb.q", durable=True)
        ch.queue_declare("nb.doomed", durable=True)
        ch.queue_declare("nb.stream", durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_declare("nb.prio", durable=True, arguments={"x-max-priority": 3})
        ch.queue_bind("nb.q", "nb.x", routing_key="a.#")
        ch.queue_bind("nb.doomed", "nb.x", routing_key="#")
        ch.queue_bind("nb.stream", "nb.x", routing_key="a.*")
        persistent = pika.BasicProperties(delivery_mode=2)
        for i in range(20):
            ch.basic_publish("nb.x", "a.b", f"m{i}".encode(), persistent)
        ch.queue_unbind("nb.doomed", "nb.x", routing_key="#")
        ch.exchange_unbind("nb.x", "nb.gone", routing_key="")
        ch.queue_delete("nb.doomed")
        ch.queue_delete("nb.prio")
        ch.exchange_delete("nb.gone")
        ch.exchange_delete("nb.delay2")
        ch.queue_declare("nb.transient", durable=False, arguments={"x-queue-backend": "log"})


def _second_run(broker: RunningBroker) -> None:
    with _connect(broker) as connection:
        ch = connection.channel()
        ch.confirm_delivery()
        assert ch.queue_declare("nb.q", durable=True, passive=True).method.message_count == 20
        ch.exchange_declare("nb.x", "topic", durable=True, passive=True)
        ch.exchange_declare("nb.delay", "x-delayed-message", durable=True, passive=True)
        ch.exchange_delete("nb.delay")
        ch.queue_declare("nb.again", durable=True)
        ch.queue_bind("nb.again", "nb.x", routing_key="#")
        ch.basic_publish("nb.x", "z", b"again", pika.BasicProperties(delivery_mode=2))
        bodies = []
        for _ in range(20):
            _method, _props, body = ch.basic_get("nb.q", auto_ack=True)
            bodies.append(body)
        assert bodies == [f"m{i}".encode() for i in range(20)]
        _method, _props, body = ch.basic_get("nb.again", auto_ack=True)
        assert body == b"again"
        ch.queue_delete("nb.again")


async def _run_broker(tmp_path: Path, workload: Callable[[RunningBroker], None]) -> None:
    async with trio.open_nursery() as nursery:
        broker = await start_broker(nursery, BrokerConfig(port=0, data_dir=tmp_path))
        await trio.to_thread.run_sync(workload, broker)
        nursery.cancel_scope.cancel()


async def test_no_fsync_on_the_trio_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = SyncCalls(monkeypatch)
    await _run_broker(tmp_path, _first_run)
    await _run_broker(tmp_path, _second_run)
    assert not calls.on_trio, "\n".join(calls.on_trio[:5])
    assert calls.in_workers > 0


async def test_a_failed_definitions_write_answers_541(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The declare-ok waits for the definitions write; when it fails the channel closes with
    541, and the connection (and the broker) go on."""
    real = StorageEnv.atomic_write
    failing = threading.Event()

    def atomic_write(env: StorageEnv, path: Path, data: bytes, *, fsync: bool = True) -> None:
        if failing.is_set() and path.name == DEFINITIONS_FILE:
            raise OSError(28, "No space left on device")
        real(env, path, data, fsync=fsync)

    monkeypatch.setattr(StorageEnv, "atomic_write", atomic_write)

    def workload(broker: RunningBroker) -> None:
        with _connect(broker) as connection:
            ch = connection.channel()
            ch.exchange_declare("nb.fine", "direct", durable=True)
            failing.set()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                ch.exchange_declare("nb.unstored", "direct", durable=True)
            assert closed.value.reply_code == 541
            assert "definitions could not be stored" in closed.value.reply_text
            failing.clear()
            ch = connection.channel()
            ch.exchange_declare("nb.transient", "direct", durable=False)
            ch.queue_declare("nb.stored", durable=True)

    await _run_broker(tmp_path, workload)


async def test_other_connections_go_on_during_a_slow_definitions_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A declare waits for its definitions write (here a slow disk: 1 s); meanwhile another
    connection declares, publishes and gets at once."""
    real = StorageEnv.atomic_write
    slow = threading.Event()
    writing, written = threading.Event(), threading.Event()

    def atomic_write(env: StorageEnv, path: Path, data: bytes, *, fsync: bool = True) -> None:
        if slow.is_set() and path.name == DEFINITIONS_FILE:
            writing.set()
            time.sleep(1.0)
            written.set()
        real(env, path, data, fsync=fsync)

    monkeypatch.setattr(StorageEnv, "atomic_write", atomic_write)

    def workload(broker: RunningBroker) -> None:
        with _connect(broker) as waiting, _connect(broker) as other:
            other_ch = other.channel()
            other_ch.queue_declare("nb.other", durable=False)
            slow.set()
            declared: list[float] = []

            def declare() -> None:
                start = time.monotonic()
                waiting.channel().exchange_declare("nb.slow", "direct", durable=True)
                declared.append(time.monotonic() - start)

            # pika's BlockingConnection is not thread-safe: each connection stays in one thread.
            thread = threading.Thread(target=declare)
            thread.start()
            assert writing.wait(10)  # the declare is waiting for its write now
            other_ch.basic_publish("", "nb.other", b"meanwhile")
            _method, _props, body = other_ch.basic_get("nb.other", auto_ack=True)
            assert body == b"meanwhile"
            assert not written.is_set()  # it did not wait for the write
            thread.join(10)
            assert len(declared) == 1
            assert declared[0] >= 0.9  # its declare-ok waited for the write

    await _run_broker(tmp_path, workload)
