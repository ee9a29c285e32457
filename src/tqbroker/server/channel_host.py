"""What a channel needs of its connection: ``ChannelHost``, the one way a ``Channel`` reaches
the ``AMQPConnection`` it belongs to (sending methods and deliveries, back-pressure, closing
itself or, for a bug, the connection)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..backends.base import Popped
from ..broker.consumer import EncodedDelivery
from ..broker.stats import StatsTotal
from ..model import Message
from ..protocol import methods as m
from ..protocol.errors import AMQPError
from .deliveries import AckDeadlines

if TYPE_CHECKING:
    from .channel import Channel


class ChannelHost(AckDeadlines, Protocol):
    """What a channel needs of its connection (``AMQPConnection``)."""

    @property
    def stats(self) -> StatsTotal:
        """The connection's counters: its channels' are parts of it."""
        ...

    @property
    def notifies_cancel(self) -> bool:
        """The client asked for ``basic.cancel`` when a queue deletes its consumer."""
        ...

    def send_method(self, channel: int, method: m.Method) -> None: ...

    def write_deliver(
        self,
        channel: int,
        consumer_tag: bytes,
        delivery_tag: int,
        redelivered: bool,
        message: Message,
    ) -> None:
        """Send ``basic.deliver`` (``consumer_tag`` as a shortstr) with the message."""
        ...

    def write_delivers(
        self, channel: int, consumer_tag: bytes, first_tag: int, entries: list[Popped]
    ) -> int:
        """``write_deliver`` each of ``entries`` (``message_id, message, redelivered``), the
        delivery tags from ``first_tag`` on; the number of them redelivered."""
        ...

    def write_encoded_delivers(
        self, channel: int, consumer_tag: bytes, first_tag: int, entries: list[EncodedDelivery]
    ) -> None:
        """``write_delivers`` of messages given as their encoded parts (none redelivered)."""
        ...

    def write_get_ok(
        self, channel: int, delivery_tag: int, redelivered: bool, message: Message, left: int
    ) -> None: ...

    def write_return(self, channel: int, message: Message) -> None:
        """Return an unroutable mandatory message (``basic.return`` 312 NO_ROUTE)."""
        ...

    def can_write(self) -> bool:
        """False while the client is slow to read what was queued for it."""
        ...

    def confirms_pending(self, channel: Channel) -> None:
        """Call ``channel.flush_confirms()`` once the current read batch is handled."""
        ...

    def fail_channel(self, err: AMQPError) -> None: ...

    def internal_error(self, exc: Exception, where: str) -> None:
        """A bug in ``where``: close the connection (541)."""
        ...
