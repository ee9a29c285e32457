"""aio-pika against the broker (running in its own thread); each test drives an asyncio event loop
with ``asyncio.run`` from a synchronous test function."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aio_pika.exceptions
import pamqp.commands
import pytest
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.patterns import RPC
from aiormq.abc import DeliveredMessage

from tests.support.polling import eventually_async
from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(40)


def run(main: Callable[[], Awaitable[None]], timeout: float = 20.0) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main(), timeout)

    asyncio.run(bounded())


def test_publisher_confirms_and_returns(tqbroker_thread: RunningBroker) -> None:
    async def main() -> None:
        async with await aio_pika.connect(tqbroker_thread.url) as conn:
            channel = await conn.channel()  # publisher_confirms=True by default
            queue = await channel.declare_queue("", exclusive=True)
            for i in range(20):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(f"m{i}".encode(), message_id=str(i)),
                    routing_key=queue.name,
                )
                assert isinstance(confirmation, pamqp.commands.Basic.Ack)

            declared = await channel.declare_queue(queue.name, passive=True)
            assert declared.declaration_result.message_count == 20

            # Unroutable and mandatory: aio-pika resolves the publish with the returned message.
            returned = await channel.default_exchange.publish(
                aio_pika.Message(b"nobody home", message_id="r1"),
                routing_key="no-such-queue",
                mandatory=True,
            )
            assert isinstance(returned, DeliveredMessage)
            assert returned.body == b"nobody home"

            strict = await conn.channel(on_return_raises=True)
            with pytest.raises(aio_pika.exceptions.DeliveryError) as excinfo:
                await strict.default_exchange.publish(
                    aio_pika.Message(b"nobody home", message_id="r2"),
                    routing_key="no-such-queue",
                    mandatory=True,
                )
            assert isinstance(excinfo.value.frame, pamqp.commands.Basic.Return)
            assert excinfo.value.frame.reply_code == 312

            bodies = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        bodies.append(message.body)
                    if len(bodies) == 20:
                        break
            assert bodies == [f"m{i}".encode() for i in range(20)]

    run(main)


def test_qos_limits_in_flight_messages(tqbroker_thread: RunningBroker) -> None:
    async def main() -> None:
        async with await aio_pika.connect(tqbroker_thread.url) as conn:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=2)
            queue = await channel.declare_queue("", exclusive=True)
            for i in range(6):
                await channel.default_exchange.publish(
                    aio_pika.Message(f"q{i}".encode()), routing_key=queue.name
                )

            pending: list[AbstractIncomingMessage] = []

            async def on_message(message: AbstractIncomingMessage) -> None:
                pending.append(message)

            await queue.consume(on_message)
            await eventually_async(lambda: len(pending) >= 2)
            await asyncio.sleep(0.3)  # and no more: the prefetch window is full
            assert [m.body for m in pending] == [b"q0", b"q1"]

            await pending[0].ack()
            await eventually_async(lambda: len(pending) >= 3)
            await asyncio.sleep(0.3)
            assert [m.body for m in pending] == [b"q0", b"q1", b"q2"]

            await pending[2].ack(multiple=True)  # acks q1 and q2
            await eventually_async(lambda: len(pending) >= 5)
            await asyncio.sleep(0.3)
            assert [m.body for m in pending] == [b"q0", b"q1", b"q2", b"q3", b"q4"]

    run(main)


def test_queue_iterator_with_reject_and_requeue(tqbroker_thread: RunningBroker) -> None:
    async def main() -> None:
        async with await aio_pika.connect(tqbroker_thread.url) as conn:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=10)
            exchange = await channel.declare_exchange("aio.events", aio_pika.ExchangeType.TOPIC)
            # Not auto-delete: leaving the iterator cancels its consumer, which would delete it.
            queue = await channel.declare_queue("aio.events.orders", exclusive=True)
            await queue.bind(exchange, "order.*")
            for key in ("order.created", "user.created", "order.paid", "order.failed"):
                await exchange.publish(
                    aio_pika.Message(key.encode(), headers={"key": key}), routing_key=key
                )

            seen: list[tuple[bytes, bool | None]] = []
            async with queue.iterator() as it:
                async for message in it:
                    seen.append((message.body, message.redelivered))
                    if message.body == b"order.failed" and not message.redelivered:
                        await message.nack(requeue=True)  # try again once
                        continue
                    assert message.headers == {"key": message.body.decode()}
                    await message.ack()
                    if message.body == b"order.failed":
                        break
            assert seen == [
                (b"order.created", False),
                (b"order.paid", False),
                (b"order.failed", False),
                (b"order.failed", True),
            ]
            # message.process() rejects (without requeue) when the block raises.
            await exchange.publish(aio_pika.Message(b"boom"), routing_key="order.boom")
            message = await queue.get(timeout=5)
            with pytest.raises(ValueError, match="boom"):
                async with message.process():
                    raise ValueError("boom")
            assert await queue.get(fail=False) is None

    run(main)


def test_transactions(tqbroker_thread: RunningBroker) -> None:
    async def main() -> None:
        async with await aio_pika.connect(tqbroker_thread.url) as conn:
            observer = await conn.channel()
            queue = await observer.declare_queue("", exclusive=True)
            channel = await conn.channel(publisher_confirms=False)

            async with channel.transaction():
                for i in range(3):
                    await channel.default_exchange.publish(
                        aio_pika.Message(f"tx{i}".encode()), routing_key=queue.name
                    )
                declared = await observer.declare_queue(queue.name, passive=True)
                assert declared.declaration_result.message_count == 0
            declared = await observer.declare_queue(queue.name, passive=True)
            assert declared.declaration_result.message_count == 3

            tx = channel.transaction()
            await tx.select()
            await channel.default_exchange.publish(
                aio_pika.Message(b"rolled back"), routing_key=queue.name
            )
            await tx.rollback()
            declared = await observer.declare_queue(queue.name, passive=True)
            assert declared.declaration_result.message_count == 3

    run(main)


def test_rpc_with_reply_to_and_correlation_id(tqbroker_thread: RunningBroker) -> None:
    async def main() -> None:
        async with (
            await aio_pika.connect(tqbroker_thread.url) as server_conn,
            await aio_pika.connect(tqbroker_thread.url) as client_conn,
        ):
            server = await server_conn.channel()
            requests = await server.declare_queue("aio_rpc")

            async def serve(message: AbstractIncomingMessage) -> None:
                async with message.process():
                    n = int(message.body)
                    assert message.reply_to is not None
                    await server.default_exchange.publish(
                        aio_pika.Message(
                            str(n + 1).encode(), correlation_id=message.correlation_id
                        ),
                        routing_key=message.reply_to,
                    )

            await requests.consume(serve)

            client = await client_conn.channel()
            callback_queue = await client.declare_queue("", exclusive=True)
            futures: dict[str, asyncio.Future[bytes]] = {}

            async def on_response(message: AbstractIncomingMessage) -> None:
                assert message.correlation_id is not None
                futures.pop(message.correlation_id).set_result(message.body)

            await callback_queue.consume(on_response, no_ack=True)

            async def call(n: int) -> int:
                corr_id = str(uuid.uuid4())
                futures[corr_id] = asyncio.get_running_loop().create_future()
                await client.default_exchange.publish(
                    aio_pika.Message(
                        str(n).encode(), reply_to=callback_queue.name, correlation_id=corr_id
                    ),
                    routing_key="aio_rpc",
                )
                return int(await futures[corr_id])

            results = await asyncio.gather(*(call(n) for n in range(20)))
            assert results == [n + 1 for n in range(20)]

    run(main)


def test_rpc_pattern(tqbroker_thread: RunningBroker) -> None:
    """aio_pika.patterns.RPC: a headers-exchange DLX, exclusive consumers, mandatory publishes."""

    async def main() -> None:
        async with (
            await aio_pika.connect(tqbroker_thread.url) as server_conn,
            await aio_pika.connect(tqbroker_thread.url) as client_conn,
        ):
            server_rpc = await RPC.create(await server_conn.channel())

            async def multiply(*, x: int, y: int) -> int:
                return x * y

            async def explode(**_: Any) -> None:
                raise RuntimeError("exploded")

            await server_rpc.register("multiply", multiply, auto_delete=True)
            await server_rpc.register("explode", explode, auto_delete=True)

            client_rpc = await RPC.create(await client_conn.channel())
            assert await client_rpc.proxy.multiply(x=6, y=7) == 42
            results = await asyncio.gather(
                *(client_rpc.call("multiply", kwargs={"x": i, "y": 3}) for i in range(10))
            )
            assert results == [i * 3 for i in range(10)]
            with pytest.raises(RuntimeError, match="exploded"):
                await client_rpc.call("explode")

    run(main)


def test_robust_connection_consume_publish(tqbroker_thread: RunningBroker) -> None:
    async def main() -> None:
        conn = await aio_pika.connect_robust(tqbroker_thread.url)
        async with conn:
            channel = await conn.channel()
            queue = await channel.declare_queue("robust.basic", auto_delete=True)
            got: list[bytes] = []
            await queue.consume(functools.partial(_ack_into, into=got))
            for i in range(5):
                await channel.default_exchange.publish(
                    aio_pika.Message(f"r{i}".encode()), routing_key="robust.basic"
                )
            await eventually_async(lambda: len(got) == 5)
            assert got == [f"r{i}".encode() for i in range(5)]
        assert conn.is_closed

    run(main)


async def _ack_into(message: AbstractIncomingMessage, into: list[bytes]) -> None:
    await message.ack()
    into.append(message.body)


def test_robust_connection_recovers_after_broker_restart() -> None:
    """The broker restarts on the same port: the robust connection reconnects, redeclares its
    queue, exchange and binding, restarts its consumer, and publishing works again."""

    async def main() -> None:
        got: list[bytes] = []
        reconnected = asyncio.Event()

        async def on_reconnect(*_: object) -> None:
            reconnected.set()

        # The brokers start and stop in worker threads so the client's loop keeps running
        # (and answers the broker's connection.close) meanwhile.
        first_cm = running_broker(BrokerConfig(port=0))
        first = await asyncio.to_thread(first_cm.__enter__)
        try:
            conn = await aio_pika.connect_robust(first.url, reconnect_interval=0.2)
            conn.reconnect_callbacks.add(on_reconnect)
            channel = await conn.channel()
            exchange = await channel.declare_exchange("robust.x", aio_pika.ExchangeType.DIRECT)
            queue = await channel.declare_queue("robust.q")
            await queue.bind(exchange, "k")
            await queue.consume(functools.partial(_ack_into, into=got))
            await exchange.publish(aio_pika.Message(b"before"), routing_key="k")
            await eventually_async(lambda: got == [b"before"])
        finally:
            # Clients get connection.close (320 CONNECTION_FORCED).
            await asyncio.to_thread(first_cm.__exit__, None, None, None)

        second_cm = running_broker(BrokerConfig(port=first.port))
        second = await asyncio.to_thread(second_cm.__enter__)
        try:
            await asyncio.wait_for(reconnected.wait(), 10)
            # The robust channel restored exchange, queue, binding and consumer.
            async with await aio_pika.connect(second.url) as other:
                ch = await other.channel()
                declared = await ch.declare_queue("robust.q", passive=True)
                assert declared.declaration_result.consumer_count == 1
                other_exchange = await ch.get_exchange("robust.x")
                await other_exchange.publish(aio_pika.Message(b"after"), routing_key="k")
            await eventually_async(lambda: got == [b"before", b"after"])
            await conn.close()
        finally:
            await asyncio.to_thread(second_cm.__exit__, None, None, None)

    run(main, timeout=30)
