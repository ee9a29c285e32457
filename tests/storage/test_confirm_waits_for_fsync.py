"""A publisher confirm never arrives while the fsync covering its message is still in flight
(the log's fsync is held by fault injection, no tmpfs needed); it arrives once the fsync is
done. Classic queues and streams on the log backend, aio-pika over loopback."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path

import aio_pika
import aio_pika.exceptions
import httpx
import pamqp.commands
import pika
import pytest
from pamqp.common import Arguments

from tqbroker.backends.log import segment as segment_module
from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker

pytestmark = pytest.mark.timeout(60)


class HeldSync:
    """The log's fsync, held (``hold()``) until ``release()``; ``entered`` is set once a
    held fsync has begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.fail = False
        self._released = threading.Event()
        self._released.set()
        real = segment_module.Segment.sync

        def sync(segment: segment_module.Segment, *, indexes: bool = True) -> None:
            if not self._released.is_set():
                self.entered.set()
                self._released.wait(30)
            if self.fail:
                raise OSError(errno.EIO, "injected I/O error")
            real(segment, indexes=indexes)

        monkeypatch.setattr(segment_module.Segment, "sync", sync)

    def hold(self) -> None:
        self.entered.clear()
        self._released.clear()

    def release(self, *, fail: bool = False) -> None:
        """Let the held fsync go on; with ``fail`` it (and every later one) fails."""
        self.fail = fail
        self._released.set()


@pytest.mark.parametrize(
    "arguments",
    [{"x-queue-backend": "log"}, {"x-queue-type": "stream"}],
    ids=["classic", "stream"],
)
def test_no_confirm_while_the_fsync_covering_the_publish_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: Arguments
) -> None:
    held = HeldSync(monkeypatch)

    async def main(url: str) -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.declare_queue("q", durable=True, arguments=arguments)
            exchange = channel.default_exchange
            await exchange.publish(aio_pika.Message(b"before", delivery_mode=2), "q")
            held.hold()
            confirm = asyncio.create_task(
                exchange.publish(aio_pika.Message(b"held", delivery_mode=2), "q")
            )
            entered = await asyncio.get_running_loop().run_in_executor(None, held.entered.wait, 10)
            assert entered, "no fsync began"
            await asyncio.sleep(0.5)
            assert not confirm.done(), "confirmed while its fsync was in flight"
            held.release()
            result = await asyncio.wait_for(confirm, 10)
            assert isinstance(result, pamqp.commands.Basic.Ack)

    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as broker:
        asyncio.run(asyncio.wait_for(main(broker.url), 30))


async def confirm_of(publish: asyncio.Task[object]) -> str:
    """ "ack" or "nack", however the client reports it."""
    try:
        result = await asyncio.wait_for(publish, 10)
    except aio_pika.exceptions.DeliveryError:
        return "nack"
    return "ack" if isinstance(result, pamqp.commands.Basic.Ack) else "nack"


def test_a_failed_fsync_nacks_the_publishes_that_came_while_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish that came while a flush was failing may share its lost pages: it is nacked
    with the publishes that flush covered, not only at a later retry."""
    held = HeldSync(monkeypatch)

    async def main(url: str) -> None:
        loop = asyncio.get_running_loop()
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.declare_queue("q", durable=True, arguments={"x-queue-backend": "log"})
            exchange = channel.default_exchange
            held.hold()
            covered = asyncio.create_task(
                exchange.publish(aio_pika.Message(b"covered", delivery_mode=2), "q")
            )
            assert await loop.run_in_executor(None, held.entered.wait, 10), "no fsync began"
            later = asyncio.create_task(
                exchange.publish(aio_pika.Message(b"later", delivery_mode=2), "q")
            )
            await asyncio.sleep(0.3)  # it reached the broker while the fsync was held
            held.release(fail=True)
            assert await confirm_of(covered) == "nack"
            nacked_at = loop.time()
            assert await confirm_of(later) == "nack"
            # The same failure, not the retry a second later (bound loose for a loaded machine).
            assert loop.time() - nacked_at < 0.9

    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as broker:
        asyncio.run(asyncio.wait_for(main(broker.url), 30))


def test_a_failed_fdatasync_stays_final_after_the_flushers_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fdatasync the kernel may have dropped the pages: a later fsync that
    "succeeds" proves nothing, so the backend refuses durable writes (and /health says so)
    until a restart, however long the flusher goes on retrying."""
    held = HeldSync(monkeypatch)
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as broker:
        channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        channel.confirm_delivery()
        channel.queue_declare("d", durable=True, arguments={"x-queue-backend": "log"})
        channel.basic_publish("", "d", b"kept", pika.BasicProperties(delivery_mode=2))
        held.fail = True
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", "d", b"lost", pika.BasicProperties(delivery_mode=2))
        held.fail = False  # the disk "recovers"
        # Consumers go on acking (each ack asks for a flush); the flusher retries meanwhile.
        while (got := channel.basic_get("d"))[0] is not None:
            channel.basic_ack(got[0].delivery_tag)
        channel.connection.sleep(2.5)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", "d", b"after", pika.BasicProperties(delivery_mode=2))
        assert httpx.get(f"{broker.http_url}/health").status_code == 503
        channel.connection.close()
