"""A Trio application that hosts its own tqbroker and talks to it.

The broker runs in the app's nursery (``nursery.start(tqbroker.serve, config)`` returns once it is
listening); the app then uses aio-pika, an asyncio client, through trio-asyncio to publish a few
messages and consume them back.

Install (from the checkout's root; the ``asyncio`` extra brings trio-asyncio and aio-pika)::

    python3 -m pip install -e ".[asyncio]"

and run it: ``python3 examples/embedded.py`` (AMQP on an ephemeral port of 127.0.0.1, no HTTP
API or metrics port, data in a temporary directory removed at the end: it runs beside a broker
on the default ports and data directory).
"""

from __future__ import annotations

import tempfile

import aio_pika
import trio
import trio_asyncio

import tqbroker


async def round_trip(url: str, count: int) -> list[str]:
    """Plain asyncio code: publish ``count`` messages with confirms, then consume them."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()  # publisher confirms are on by default
        queue = await channel.declare_queue("", exclusive=True)
        for i in range(count):
            await channel.default_exchange.publish(
                aio_pika.Message(f"hello {i}".encode()), routing_key=queue.name
            )
        received: list[str] = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    received.append(message.body.decode())
                if len(received) == count:
                    break
        return received


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tqbroker-embedded-") as data_dir:
        # AMQP only (no HTTP API, so no metrics port either), on an ephemeral port.
        config = tqbroker.BrokerConfig(port=0, http_port=None, data_dir=data_dir)
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(tqbroker.serve, config)
            host, port = listening.amqp[0]
            print(f"embedded broker listening on {host}:{port}")
            async with trio_asyncio.open_loop():
                received = await trio_asyncio.aio_as_trio(round_trip)(
                    f"amqp://guest:guest@{host}:{port}/", 3
                )
            print("received:", ", ".join(received))
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
