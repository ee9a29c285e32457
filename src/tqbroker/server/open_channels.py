"""The open channels of one connection, by number.

Responsibilities:
- opening and closing channels (a closed channel's consumers are cancelled and its unacked
  deliveries requeued: ``Channel.close``), one at a time or all together, paced when there are
  many;
- the channels with publisher confirms waiting to be flushed at the end of a read batch;
- what the connection's other tasks ask of all of them: their unacked deliveries (the ack
  timeout) and waking the queues they consume from (the client caught up).
"""

from __future__ import annotations

from collections.abc import ValuesView

from ..broker.pacing import Pacer
from ..broker.vhost import VirtualHost
from ..protocol.errors import AMQPError, ReplyCode
from .access import ChannelAccess
from .channel import Channel
from .channel_host import ChannelHost
from .deliveries import Deliveries


class OpenChannels:
    """A connection's open channels."""

    def __init__(self) -> None:
        self._by_number: dict[int, Channel] = {}
        self._confirming: dict[int, Channel] = {}

    def __len__(self) -> int:
        return len(self._by_number)

    def values(self) -> ValuesView[Channel]:
        return self._by_number.values()

    def get(self, number: int) -> Channel | None:
        return self._by_number.get(number)

    def require(self, number: int) -> Channel:
        """The open channel ``number`` (the protocol checked it is open; be safe anyway)."""
        channel = self._by_number.get(number)
        if channel is None:
            raise AMQPError(ReplyCode.CHANNEL_ERROR, f"channel {number} is not open")
        return channel

    def open(
        self, host: ChannelHost, number: int, vhost: VirtualHost, access: ChannelAccess
    ) -> Channel:
        channel = self._by_number[number] = Channel(host, number, vhost, access)
        return channel

    def close(self, number: int) -> None:
        """Close channel ``number`` if it is open."""
        channel = self._by_number.pop(number, None)
        if channel is not None:
            channel.close()
            self._confirming.pop(number, None)

    async def close_paced(self, number: int) -> None:
        """``close``, giving way to other tasks (``Channel.close_paced``: 100k consumers)."""
        channel = self._by_number.pop(number, None)
        if channel is not None:
            self._confirming.pop(number, None)
            await channel.close_paced()

    def close_all(self) -> None:
        channels = list(self._by_number.values())
        self._by_number.clear()
        self._confirming.clear()
        for channel in channels:
            channel.close()

    async def close_all_paced(self) -> None:
        """``close_all``, giving way to other tasks now and then (there may be 100k)."""
        channels = list(self._by_number.values())
        self._by_number.clear()
        self._confirming.clear()
        pacer = Pacer()
        for channel in channels:
            await channel.close_paced()
            await pacer.step()

    def confirms_pending(self, channel: Channel) -> None:
        """``channel`` has confirms to send once the current read batch is handled."""
        self._confirming[channel.number] = channel

    def flush_confirms(self) -> None:
        for channel in self._confirming.values():
            channel.flush_confirms()
        self._confirming.clear()

    def unacked(self) -> list[tuple[int, Deliveries]]:
        return [(number, channel.deliveries) for number, channel in self._by_number.items()]

    def wake_queues(self) -> None:
        """Let the queues every channel consumes from deliver again."""
        for channel in self._by_number.values():
            channel.wake_queues()
