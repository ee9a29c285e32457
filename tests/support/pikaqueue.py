"""What several pika tests do to a queue: ``drain(channel, queue)``, every message in it now
(``basic.get`` with auto-ack until it is empty), as their bodies in order."""

from __future__ import annotations

from pika.adapters.blocking_connection import BlockingChannel


def drain(channel: BlockingChannel, queue: str) -> list[bytes]:
    bodies: list[bytes] = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)
