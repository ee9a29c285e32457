"""One client connection's AMQP session (``AMQPConnection``): what the client's bytes mean and
what goes back. Its Trio side (the read loop, the writer task, the nursery, the fault
boundary) is ``transport.py``, which feeds it.

Responsibilities:
- the protocol state (``protocol.ServerConnection``) and the handshake (``handshake.py``)
  within a deadline; then channels opened and closed, their methods handed to them
  (``Channel``, ``dispatch.py``), and what they send written (``ChannelHost``);
- what each protocol event does, in order (``received``): publishes, the connection's own
  methods, the channels';
- the deadlines the transport keeps: the handshake's, two heartbeat intervals (``writer.py``
  sends ours from tune-ok on), the close-ok's; the ack timeouts (``deliveries.py``);
- publishers blocked during a resource alarm (``flow.py``);
- errors: soft ones close the channel, hard ones send ``connection.close`` and wait briefly for
  ``close-ok``; a bug (``internal_error``) closes this connection alone with 541
  INTERNAL_ERROR;
- teardown: channels closed (unacked messages requeued), exclusive queues deleted.

It is over 400 lines as one job: every event the client sends and every request of its
channels (``ChannelHost``) meets the connection's state here (protocol, handshake, channels,
deadline), on the path of every frame.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio
import trio.lowlevel

from .. import clock
from ..backends.base import Popped
from ..broker.consumer import EncodedDelivery
from ..broker.pacing import Slice
from ..broker.stats import ConnectionStats
from ..broker.storage import storage_error
from ..broker.vhost import VirtualHost
from ..model import Message
from ..protocol.connection import (
    NEED_DATA,
    BadProtocolHeader,
    ContentReceived,
    EndOfStream,
    Limits,
    MethodReceived,
    ProtocolHeaderReceived,
    ServerConnection,
    State,
)
from ..protocol.errors import AMQPError, ReplyCode
from ..protocol.frames import PROTOCOL_HEADER
from ..protocol.methods import (
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTuneOk,
    ConnectionUpdateSecret,
    ConnectionUpdateSecretOk,
    Method,
)
from .access import ChannelAccess
from .addresses import UNKNOWN, local_address, peer_address, socket_of, text
from .channel import Channel
from .deliveries import AckTimeouts
from .dispatch import dispatch
from .encoding import write_get_ok, write_return
from .flow import PublisherFlow
from .handshake import Handshake, HangUp
from .latency_trace import TRACE
from .open_channels import OpenChannels
from .transport import CLOSE_TIMEOUT, Stream, Transport
from .weakcall import weakly
from .writer import ConnectionWriter

if TYPE_CHECKING:
    from ..broker.broker import Broker

log = logging.getLogger(__name__)

# What a method other than a publish counts for in the read loop's slice (``Slice.used``): a
# declare or a consume costs as much as ~8 publishes, so a pipelined stream of them has the
# clock looked at often enough to give way every slice.
METHOD_WEIGHT: Final = 8


class AMQPConnection:
    """One client connection: the ``Session`` its ``Transport`` feeds, and the ``ChannelHost``
    of its channels."""

    def __init__(
        self,
        broker: Broker,
        stream: Stream,
        on_open: Callable[[], None] | None = None,
        *,
        peer_username: str | None = None,  # from a verified TLS client certificate (EXTERNAL)
        deadline: float | None = None,  # the handshake's, if it began earlier (amqps)
    ) -> None:
        """``on_open`` is called once the client has opened a vhost (its handshake is done)."""
        self.broker = broker
        self._on_open = on_open
        self.stream = stream
        self.socket = socket_of(stream)
        config = broker.config
        self.protocol = ServerConnection(
            Limits(
                channel_max=config.channel_max,
                frame_max=config.frame_max,
                heartbeat=config.heartbeat,
                max_message_size=config.max_message_size,
                max_incomplete_body=config.max_incomplete_body_per_connection,
            ),
            broker.incomplete_bodies,
        )
        peer = peer_address(self.socket)
        self.peer, self.peer_host = text(peer), "" if peer[0] == UNKNOWN else peer[0]
        self.channels = OpenChannels()
        send = weakly(self._send_handshake, None)
        local = text(local_address(self.socket))
        self.handshake = Handshake(
            broker, self.peer, self.peer_host, send, local, peer_username=peer_username
        )
        self.handshake.channels = self.channels
        self.vhost: VirtualHost | None = None
        self._deadline = (
            deadline if deadline is not None else trio.current_time() + config.handshake_timeout
        )
        self._ack_timeouts = AckTimeouts(
            self.peer, weakly(self.channels.unacked, []), weakly(self.fail_channel, None)
        )
        self.flow = PublisherFlow(broker.alarms, send, self.handshake, self.peer)
        # Its channels' counters and its socket's (``broker/stats.py``); part of its vhost's.
        self.stats = ConnectionStats()
        broker.stats_sampler.register(self.stats)
        self.writer = ConnectionWriter(stream, self.stats, self.peer, self.channels.wake_queues)
        self._transport = Transport(stream, self.writer, self.peer)

    # -- lifetime (``Session``: what the transport calls) ------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes (``Transport.run``). Never raises for the peer's
        mistakes, nor for an unexpected exception (a bug) in this connection's tasks: that is
        logged and closes this connection alone (``internal_error``). Cancellation
        propagates."""
        self.handshake.log_accepted()
        await self._transport.run(self)

    def started(self) -> None:
        """The nursery is open: the ack timeout task starts (heartbeats start at tune-ok)."""
        self._transport.start_soon(self._ack_timeouts.run, "the ack timeout task")

    async def ended(self) -> None:
        """The connection is over: teardown, then its place in the connection limits freed."""
        try:
            await self._teardown()
        except Exception:
            log.exception("connection %s: teardown failed", self.peer)
        self.broker.limits.release(self.handshake)
        self.handshake.log_closed()

    async def _teardown(self) -> None:
        """Close the channels (unacked deliveries requeued) and delete the exclusive queues,
        giving way to other tasks now and then (there may be 100k of them)."""
        self.protocol.release_bodies()
        await self.channels.close_all_paced()
        if self.vhost is not None:
            self.vhost.stats.remove(self.stats)  # its counts stay in the vhost's
            await self.vhost.connection_closed(self)

    # -- deadlines ---------------------------------------------------------------------------

    def receive_deadline(self) -> float:
        """The handshake's deadline, then two heartbeat intervals (none without heartbeats),
        then the close-ok's (``CLOSE_TIMEOUT`` after ``connection.close``)."""
        state = self.protocol.state
        if state is State.OPEN:
            heartbeat = self.protocol.heartbeat
            return trio.current_time() + 2 * heartbeat if heartbeat else math.inf
        return self._deadline

    def timed_out(self) -> None:
        state, heartbeat = self.protocol.state, self.protocol.heartbeat
        if state is State.OPEN:
            why = f"missed heartbeats from client, timeout: {heartbeat}s"
            log.warning("closing connection %s: %s", self.peer, why)
        elif state is not State.CLOSING:
            log.warning("closing connection %s: handshake timeout", self.peer)

    # -- unexpected exceptions ---------------------------------------------------------------

    def internal_error(self, exc: Exception, where: str) -> None:
        """An unexpected exception (a bug) in ``where``: log it with its traceback and close this
        connection with ``connection.close`` 541 (its channels close: unacked deliveries are
        requeued); if it was closing already, hang up. Other connections are not affected."""
        log.error(
            "connection %s: unexpected %s in %s, closing the connection",
            self.peer,
            type(exc).__name__,
            where,
            exc_info=exc,
        )
        if self.protocol.state in (State.CLOSING, State.CLOSED):
            self._transport.abort()
            return
        error = AMQPError(
            ReplyCode.INTERNAL_ERROR, f"unexpected {type(exc).__name__} in {where}", hard=True
        )
        try:
            self._fail(error)
        except Exception:
            log.exception("connection %s: closing after an internal error failed", self.peer)
            self._transport.abort()
            return
        # The reader may be waiting without a deadline: the client has CLOSE_TIMEOUT to answer.
        self._transport.hurry(self._deadline)

    def shutdown(self, text: str = "broker shutdown") -> None:
        """Ask the client to go away (``connection.close`` 320); it has until the deadline."""
        if self.protocol.state in (State.CLOSING, State.CLOSED):
            return
        self._fail(AMQPError(ReplyCode.CONNECTION_FORCED, text))

    # -- writing -----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def _send_handshake(self, method: Method) -> None:
        if self.protocol.state in (State.CLOSING, State.CLOSED):
            return  # a close went out while the handshake waited (a shutdown): nothing more
        self.send_method(0, method)

    # -- ChannelHost (what channels send and ask) --------------------------------------------

    def send_method(self, channel: int, method: Method) -> None:
        self.write(self.protocol.send_method(channel, method))

    def write_deliver(
        self,
        channel: int,
        consumer_tag: bytes,
        delivery_tag: int,
        redelivered: bool,
        message: Message,
    ) -> None:
        self.writer.deliver(
            channel, consumer_tag, delivery_tag, redelivered, message, self.protocol.frame_max
        )

    def write_delivers(
        self, channel: int, consumer_tag: bytes, first_tag: int, entries: list[Popped]
    ) -> int:
        return self.writer.deliver_many(
            channel, consumer_tag, first_tag, entries, self.protocol.frame_max
        )

    def write_encoded_delivers(
        self, channel: int, consumer_tag: bytes, first_tag: int, entries: list[EncodedDelivery]
    ) -> None:
        self.writer.deliver_encoded(
            channel, consumer_tag, first_tag, entries, self.protocol.frame_max
        )

    def write_get_ok(
        self, channel: int, delivery_tag: int, redelivered: bool, message: Message, left: int
    ) -> None:
        frame_max = self.protocol.frame_max
        write_get_ok(self.writer.out, channel, delivery_tag, redelivered, message, left, frame_max)
        self.writer.wake()

    def write_return(self, channel: int, message: Message) -> None:
        write_return(self.writer.out, channel, message, self.protocol.frame_max)
        self.writer.wake()

    @property
    def notifies_cancel(self) -> bool:
        return self.handshake.capabilities.get("consumer_cancel_notify") is True

    @property
    def consumer_timeout_ms(self) -> int | None:
        return self.broker.config.consumer_timeout_ms

    def can_write(self) -> bool:
        """False while the client is slow to read what we already queued for it."""
        return self.writer.can_write()

    def watch_ack_deadline(self, deadline: float) -> None:
        self._ack_timeouts.watch(deadline)

    # -- reading (``Session.received``) ------------------------------------------------------

    async def received(self, data: bytes) -> bool:
        """Handle ``data``: every event it completes, in order. False: the connection ends
        (end of stream, ``close-ok``, a bad protocol header)."""
        protocol = self.protocol
        protocol.receive_data(data)
        # Messages are stamped with when the read that brought them returned.
        now_ms = clock.now_ms()
        # A read of small frames (4,000 consumes) is work enough to give way in between.
        # A run of publishes counts as its publishes, any other method as METHOD_WEIGHT.
        pace, taken = Slice(), 1
        while True:
            if pace.used(taken):
                self.channels.flush_confirms()
                await trio.lowlevel.checkpoint()
                now_ms = clock.now_ms()
            taken = 1
            try:
                event = protocol.next_event()
            except BadProtocolHeader:
                # Send the header we speak and hang up, as the spec asks.
                self.write(PROTOCOL_HEADER)
                return False
            except AMQPError as err:
                self._fail(err)
                continue
            if isinstance(event, ContentReceived):  # most events: publishes first
                try:
                    target = self.channels.get(event.channel)
                    if target is None:
                        target = self.channels.require(event.channel)
                    bodies = event.bodies
                    taken = len(bodies)
                    slots = [] if TRACE is None else [TRACE.parsed(b) for b in bodies]
                    pending = target.publish(event.method, event.properties, bodies, now_ms)
                    if TRACE is not None:
                        TRACE.routed(slots)
                    self.flow.published = True
                    if pending is not None:  # a permission check to ask: the next waits
                        self.channels.flush_confirms()
                        await pending
                        now_ms = clock.now_ms()
                except Exception as exc:
                    self._event_failed(event, exc)
                continue  # a publish never ends the connection
            if event is NEED_DATA:
                break
            if isinstance(event, EndOfStream):
                return False
            taken = METHOD_WEIGHT
            try:
                if isinstance(event, MethodReceived):
                    if event.channel == 0:
                        await self._connection_method(event.method)
                        now_ms = clock.now_ms()  # it may have waited
                    else:
                        pending = self._channel_method(event.channel, event.method)
                        if pending is not None:  # durable topology: the next frame waits
                            self.channels.flush_confirms()
                            await pending
                            now_ms = clock.now_ms()
                elif isinstance(event, ProtocolHeaderReceived):
                    self.handshake.start()
            except Exception as exc:
                self._event_failed(event, exc)
            if protocol.state is State.CLOSED:
                return False
        self.channels.flush_confirms()
        return True

    def _event_failed(self, event: object, exc: Exception) -> None:
        """Handling an event raised: ``AMQPError`` refuses it (its channel or the connection
        closes), ``HangUp`` ends the connection, an ``OSError`` in a channel's method (storage
        trouble, not the socket's) closes that channel with 506 or 541, anything else is a bug
        (``internal_error``)."""
        if isinstance(exc, HangUp):
            raise exc
        if not isinstance(event, MethodReceived | ContentReceived):
            if isinstance(exc, AMQPError):
                self._fail(exc)
            else:
                self.internal_error(exc, "the handshake")
            return
        if isinstance(exc, OSError) and event.channel:
            log.warning("connection %s: %s failed: %s", self.peer, event.method.NAME, exc)
            exc = storage_error(exc, event.method.NAME)
        if isinstance(exc, AMQPError):
            self._fail(exc.on_method(event.channel, event.method.CLASS_ID, event.method.METHOD_ID))
        else:
            self.internal_error(exc, event.method.NAME)

    def _fail(self, err: AMQPError) -> None:
        """Close the channel (soft error) or the connection (hard error)."""
        if err.hard or not err.channel:
            if self.protocol.state in (State.CLOSING, State.CLOSED):
                return
            log.info("closing connection %s: %s", self.peer, err.reply_text)
            self.flow.interrupt()  # a blocked reader must read the close-ok
            self.channels.close_all()
            self.write(self.protocol.close_connection(err))
            self._deadline = trio.current_time() + CLOSE_TIMEOUT
            return
        self.channels.close(err.channel)
        log.debug("closing channel %s on %s: %s", err.channel, self.peer, err.reply_text)
        self.write(self.protocol.close_channel(err))

    def fail_channel(self, err: AMQPError) -> None:
        """Close a channel with a (soft) error from outside the read loop (e.g. a flusher)."""
        self._fail(err)

    def confirms_pending(self, channel: Channel) -> None:
        self.channels.confirms_pending(channel)

    # -- methods -----------------------------------------------------------------------------

    def _channel_method(self, number: int, method: Method) -> Awaitable[None] | None:
        if isinstance(method, ChannelOpen):
            assert self.vhost is not None
            assert self.handshake.user is not None
            self.broker.limits.check_channel(self.handshake.user.name)
            access = ChannelAccess.of_connection(
                self.broker.authenticator.chain, self.handshake.user, self.vhost.name
            )
            opened = self.channels.open(self, number, self.vhost, access)
            self.broker.stats_sampler.register(opened.stats)
            self.write(self.protocol.send_method(number, ChannelOpenOk()))
        elif isinstance(method, ChannelClose):  # awaited: 100k consumers leave paced
            return self._close_channel(number)
        elif not isinstance(method, ChannelCloseOk):
            return dispatch(self.channels.require(number), method)
        return None

    async def _close_channel(self, number: int) -> None:
        await self.channels.close_paced(number)
        self.write(self.protocol.send_method(number, ChannelCloseOk()))

    async def _connection_method(self, method: Method) -> None:
        match method:
            case ConnectionStartOk():
                await self.handshake.start_ok(method)
            case ConnectionTuneOk():
                if self.protocol.heartbeat:
                    self._transport.start_soon(
                        functools.partial(self.writer.heartbeats, self.protocol.heartbeat / 2),
                        "the heartbeat task",
                    )
            case ConnectionOpen():
                self.vhost = await self.handshake.open(method)
                self.vhost.stats.add(self.stats)
                if self._on_open is not None:
                    self._on_open()
            case ConnectionClose():
                # Release everything (exclusive queues included) before the client hears close-ok.
                await self._teardown()
                self.send_method(0, ConnectionCloseOk())
            case ConnectionUpdateSecret():
                self.send_method(0, ConnectionUpdateSecretOk())
            case _:
                pass  # close-ok: the protocol moved to CLOSED and the read loop ends
