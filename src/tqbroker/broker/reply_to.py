"""Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to`` pseudo-queue): who waits for replies.

Responsibilities:
- ``ReplyTo``: one vhost's registry of reply addresses (``amq.rabbitmq.reply-to.<token>``, a
  random token per consuming channel) and the channel behind each; register, unregister, and
  deliver a reply published to an address (no queue, no ack).
"""

from __future__ import annotations

import base64
import logging
import os
from typing import Final, Protocol

from ..model import Message

log = logging.getLogger(__name__)

# RabbitMQ's direct reply-to pseudo-queue and the prefix of the names it hands out.
REPLY_TO: Final = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX: Final = REPLY_TO + "."


class ReplyConsumer(Protocol):
    """A channel consuming from ``amq.rabbitmq.reply-to`` (direct reply-to)."""

    def deliver_reply(self, message: Message) -> None: ...


class ReplyTo:
    """Reply addresses -> the channels consuming the replies."""

    def __init__(self) -> None:
        self._consumers: dict[str, ReplyConsumer] = {}

    def register(self, consumer: ReplyConsumer) -> str:
        """Register a direct reply-to consumer; return the reply-to address to hand out."""
        address = REPLY_TO_PREFIX + base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._consumers[address] = consumer
        return address

    def unregister(self, address: str) -> None:
        """The consumer behind ``address`` is gone (its channel closed); replies to it are
        unroutable from now on."""
        self._consumers.pop(address, None)

    def deliver(self, routing_key: str, message: Message) -> bool:
        """Deliver a message published to a direct reply-to address; False if nobody waits."""
        consumer = self._consumers.get(routing_key)
        if consumer is None:
            return False
        consumer.deliver_reply(message)
        return True
