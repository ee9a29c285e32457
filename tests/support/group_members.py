"""A consumer-group member for tests over real sockets (``Member``: a pika connection whose
channel consumes every partition ``orders-0`` .. ``orders-5`` with ``x-stream-group``), and
``pump``/``settle``, which run several members' I/O from one thread."""

from __future__ import annotations

import time

import pika
from pika.adapters.blocking_connection import BlockingChannel

PARTITIONS = 6


class Member:
    """One group member: a connection whose channel consumes every partition with
    ``x-stream-group``, acking each delivery as it comes. Told a partition was revoked
    (basic.cancel), it consumes it again to stand by for it, as docs/streams.md advises
    (``rejoin=False``: it does not)."""

    def __init__(
        self, url: str, group: str = "billing", *, offset: object = "first", rejoin: bool = True
    ) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=20)
        self.arguments = {"x-stream-group": group, "x-stream-offset": offset}
        self.rejoin = rejoin
        self.received: list[tuple[int, int]] = []  # (partition, offset)
        self.acked: list[tuple[int, int]] = []
        self.hold = False  # set: deliveries are kept unacked (in ``held``)
        self.hold_after: int | None = None  # hold from this many acks on
        self.held: list[tuple[int, int]] = []
        self.bodies: list[int] = []
        self.cancelled: list[int] = []
        self.tags: dict[str, int] = {}
        self.channel.add_on_cancel_callback(self._on_cancel)
        for p in range(PARTITIONS):
            self._consume(p)

    def _consume(self, partition: int) -> None:
        tag = self.channel.basic_consume(
            f"orders-{partition}", self._on_message, arguments=self.arguments
        )
        self.tags[tag] = partition

    def _on_message(self, ch: BlockingChannel, method, properties, body) -> None:
        partition = self.tags[method.consumer_tag]
        delivery = (partition, properties.headers["x-stream-offset"])
        self.received.append(delivery)
        self.bodies.append(int(body))
        if self.hold_after is not None and len(self.acked) >= self.hold_after:
            self.hold = True
        if self.hold:
            self.held.append(delivery)
        else:
            ch.basic_ack(method.delivery_tag)
            self.acked.append(delivery)

    def _on_cancel(self, frame) -> None:
        partition = self.tags[frame.method.consumer_tag]
        self.cancelled.append(partition)
        if self.rejoin:
            self._consume(partition)

    @property
    def partitions(self) -> set[int]:
        return {p for p, _ in self.received}

    def close(self) -> None:
        self.connection.close()


def pump(
    members: list[Member], until: int, timeout: float = 20, counted: list[Member] | None = None
) -> None:
    """Run the members' I/O until together they (or ``counted``: these, the closed ones among
    them too) received ``until`` different messages."""
    deadline = time.monotonic() + timeout
    counted = members if counted is None else counted
    while len(set().union(*(m.received for m in counted))) < until:
        assert time.monotonic() < deadline, [len(m.received) for m in counted]
        for member in members:
            member.connection.process_data_events(time_limit=0.01)


def settle(members: list[Member], seconds: float = 0.3) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for member in members:
            member.connection.process_data_events(time_limit=0.01)
