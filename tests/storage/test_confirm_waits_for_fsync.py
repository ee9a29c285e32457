"""A publisher confirm never arrives while the fsync covering its message is still in flight
(the log's fsync is held by fault injection, no tmpfs needed); it arrives once the fsync is
done. Classic queues and streams on the log backend, aio-pika over loopback."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import aio_pika
import pamqp.commands
import pytest

from tqbroker.backends.log import segment as segment_module
from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker

pytestmark = pytest.mark.timeout(60)


class HeldSync:
    """The log's fsync, held (``hold()``) until ``release()``; ``entered`` is set once a
    held fsync has begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()
        self._released.set()
        real = segment_module.Segment.sync

        def sync(segment: segment_module.Segment, *, indexes: bool = True) -> None:
            if not self._released.is_set():
                self.entered.set()
                self._released.wait(30)
            real(segment, indexes=indexes)

        monkeypatch.setattr(segment_module.Segment, "sync", sync)

    def hold(self) -> None:
        self.entered.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()


@pytest.mark.parametrize(
    "arguments",
    [{"x-queue-backend": "log"}, {"x-queue-type": "stream"}],
    ids=["classic", "stream"],
)
def test_no_confirm_while_the_fsync_covering_the_publish_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: dict[str, str]
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
