"""A consumer's channel for tests that drive queues directly: records every delivery and never
runs out of credit (the ``DeliveryChannel`` a ``Consumer`` is given)."""

from __future__ import annotations

from tqbroker.backends.base import Popped
from tqbroker.broker.consumer import UNLIMITED, Consumer, EncodedDelivery
from tqbroker.model import Message


class RecordingChannel:
    def __init__(self) -> None:
        self.deliveries: list[tuple[int, Message, bool]] = []  # (message id, message, redelivered)

    @property
    def delivered(self) -> list[tuple[int, Message]]:
        return [(message_id, message) for message_id, message, _ in self.deliveries]

    @property
    def bodies(self) -> list[bytes]:
        return [message.body for _, message, _ in self.deliveries]

    def credit(self) -> int:
        return UNLIMITED

    def deliver(
        self, consumer: Consumer, message_id: int, message: Message, redelivered: bool
    ) -> None:
        self.deliveries.append((message_id, message, redelivered))

    def deliver_many(self, consumer: Consumer, entries: list[Popped]) -> None:
        for message_id, message, redelivered in entries:
            self.deliver(consumer, message_id, message, redelivered)

    def deliver_encoded(self, consumer: Consumer, entries: list[EncodedDelivery]) -> None:
        for message_id, names, properties, body in entries:
            exchange = names[1 : 1 + names[0]].decode()
            routing_key = names[2 + names[0] :].decode()
            message = Message(exchange, routing_key, properties, bytes(body))
            self.deliver(consumer, message_id, message, False)

    def consumer_cancelled(self, consumer: Consumer) -> None:
        pass
