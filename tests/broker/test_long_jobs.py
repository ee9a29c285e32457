"""Long jobs give way without leaving a big lump of work behind them (the stall targets live in
``benchmarks/overload.py``; these check the mechanics, untimed):

- a connection's teardown frees its exclusive queues as it goes: the one list of them used to
  hold the last reference to all, so dropping it freed 100k queues in one go (~350 ms);
- a closed connection is freed by reference counting, not left in reference cycles for a full
  garbage collection (10k closed connections: one ~0.8 s pause);
- a produce waits for its records' flushes by each group commit's first and last ticket, and
  still sees a failed flush of an early record that a successful later flush follows.
"""

from __future__ import annotations

import errno
import gc
import weakref
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
import trio
import trio.testing

from tqbroker.broker import flusher as flusher_module
from tqbroker.broker.flusher import Flusher
from tqbroker.broker.queue import Queue
from tqbroker.broker.streams.durability import Durability
from tqbroker.broker.vhost import QUEUES_PER_SLICE, VirtualHost
from tqbroker.config import BrokerConfig
from tqbroker.plugins.spec import GroupCommit
from tqbroker.server.connection import AMQPConnection
from tqbroker.testing import start_broker

pytestmark = pytest.mark.timeout(60)

EXCLUSIVE_QUEUES = 10 * QUEUES_PER_SLICE


async def test_a_teardown_frees_its_exclusive_queues_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed: list[weakref.ref[Queue]] = []
    freed_before_the_last: list[int] = []
    real = VirtualHost._remove_or_log

    def remove(vhost: VirtualHost, queue: Queue) -> None:
        if queue.exclusive_owner is not None:
            if len(removed) == EXCLUSIVE_QUEUES - 1:
                freed_before_the_last.append(sum(ref() is None for ref in removed))
            removed.append(weakref.ref(queue))
        real(vhost, queue)

    monkeypatch.setattr(VirtualHost, "_remove_or_log", remove)

    def declare_and_leave(url: str) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        for n in range(EXCLUSIVE_QUEUES):
            channel.queue_declare(f"x{n}", exclusive=True)
        connection.close()

    async with trio.open_nursery() as nursery:
        broker = await start_broker(nursery, BrokerConfig(port=0, data_dir=tmp_path))
        await trio.to_thread.run_sync(declare_and_leave, broker.url)
        nursery.cancel_scope.cancel()
    assert len(removed) == EXCLUSIVE_QUEUES
    # Each slice's queues are gone once their tasks end, a scheduling round later.
    assert freed_before_the_last[0] >= EXCLUSIVE_QUEUES // 2, freed_before_the_last


def _use_everything(url: str) -> None:
    """Publisher confirms, a transaction, consumers (direct reply-to too), an exclusive queue."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("kept", durable=True)
    channel.queue_declare("", exclusive=True)
    channel.basic_publish("", "kept", b"x", pika.BasicProperties(delivery_mode=2))
    channel.basic_consume("kept", lambda *args: None)
    channel.basic_consume("amq.rabbitmq.reply-to", lambda *args: None, auto_ack=True)
    other = connection.channel()
    other.tx_select()
    other.basic_publish("", "kept", b"y")
    other.tx_commit()
    connection.close()


async def test_a_closed_connection_is_freed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[weakref.ref[AMQPConnection]] = []
    real = AMQPConnection.__init__

    def init(connection: AMQPConnection, *args: object, **kwargs: object) -> None:
        real(connection, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(weakref.ref(connection))

    monkeypatch.setattr(AMQPConnection, "__init__", init)
    async with trio.open_nursery() as nursery:
        broker = await start_broker(nursery, BrokerConfig(port=0, data_dir=tmp_path))
        gc.collect()
        gc.disable()  # only reference counting may free it
        try:
            await trio.to_thread.run_sync(_use_everything, broker.url)
            await trio.testing.wait_all_tasks_blocked()
            assert len(opened) == 1
            assert opened[0]() is None, gc.get_referrers(opened[0]())
        finally:
            gc.enable()
        nursery.cancel_scope.cancel()


class Disk:
    """A ``Flushable`` whose flushes fail while ``failing`` is set."""

    name = "disk"
    healthy = True
    needs_flush = False

    def __init__(self) -> None:
        self.failing = False

    def begin_flush(self) -> Callable[[], None]:
        failing = self.failing

        def work() -> None:
            if failing:
                raise OSError(errno.EIO, "injected I/O error")

        return work


class FailureSeen:
    """A ``FlushListener`` that says when a flush has failed."""

    def __init__(self) -> None:
        self.seen = trio.Event()

    def flushed(self, commit: GroupCommit) -> None:
        pass

    def flush_failed(self, commit: GroupCommit, upto: int) -> None:
        self.seen.set()


async def test_a_failed_flush_of_an_early_record_fails_the_produce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(flusher_module, "RETRY_SECONDS", 0)
    disk = Disk()
    commit = Flusher(disk)
    async with trio.open_nursery() as nursery:
        await nursery.start(commit.run)
        with Durability() as durability:
            disk.failing = True
            failure = FailureSeen()
            commit.listen(failure)
            durability.add([(commit, commit.request())])  # an early record...
            await failure.seen.wait()
            commit.unlisten(failure)
            disk.failing = False
            durability.add([(commit, commit.request())])  # ...then a later one, flushed
            assert not await durability.wait()
        with Durability() as durability:  # a produce after the failure is fine again
            durability.add([(commit, commit.request()), (commit, commit.request())])
            assert await durability.wait()
        assert commit._listeners == set()  # none left behind
        nursery.cancel_scope.cancel()
