"""Which handler carries out each method a client sends on a channel (``dispatch``).

Every handler raises ``AMQPError`` to refuse (the connection then closes the channel or the
connection). All are synchronous but those changing durable topology, which return what the
connection's reader awaits before the next frame: their ``*-ok`` goes out once the change is
written (``broker/definitions_file.py``). The methods RabbitMQ checks permissions of run
their checks first (``access.py``): a check not cached on the channel makes the handler
return what to await too (the check, then the method).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..protocol import methods as m
from ..protocol.errors import AMQPError, ReplyCode
from . import access
from .channel import Channel
from .topology import Topology


def dispatch(channel: Channel, method: m.Method) -> Awaitable[None] | None:
    """Carry out one method on ``channel``; raises ``AMQPError`` to refuse it. A change to
    durable topology returns what to await before its reply is sent (and the next method
    read)."""
    handler = HANDLERS.get(type(method))
    if handler is None:
        durable = DURABLE_HANDLERS.get(type(method))
        if durable is not None:
            return durable(channel, method)
        raise AMQPError(
            ReplyCode.COMMAND_INVALID, f"{method.NAME} is not a client-to-server method"
        )
    return handler(channel, method)


# -- dispatch --------------------------------------------------------------------------------

Handler = Callable[[Channel, Any], Awaitable[None] | None]
DurableHandler = Callable[[Channel, Any], Awaitable[None]]
Needs = Callable[[Channel, Any], list[access.Check]]


def _checked(needs: Needs, handler: Handler) -> Handler:
    """``handler`` after the permission checks ``needs`` says the method needs: at once when
    the channel's cache answers them all, else after awaiting them."""

    def handle(channel: Channel, method: m.Method) -> Awaitable[None] | None:
        checks = needs(channel, method)
        if checks:
            pending = channel.access.require(checks)
            if pending is not None:
                return _after(pending, handler, channel, method)
        return handler(channel, method)

    return handle


async def _after(
    pending: Awaitable[None], handler: Handler, channel: Channel, method: m.Method
) -> None:
    await pending
    if channel.closed:
        return
    then = handler(channel, method)
    if then is not None:
        await then


def _on_vhost(needs: Callable[[Any, Any], list[access.Check]]) -> Needs:
    return lambda channel, method: needs(channel.vhost, method)


def _on_topology(needs: Callable[[Any, Any], list[access.Check]]) -> Needs:
    return lambda channel, method: needs(channel.topology, method)


def _consume_needs(channel: Channel, method: m.BasicConsume) -> list[access.Check]:
    """RabbitMQ refuses a reused consumer tag before it checks the permission."""
    if method.consumer_tag and method.consumer_tag in channel.consumers:
        return []
    return access.queue_read(channel.topology, method)


def _topology(operation: Callable[[Topology, Any], m.Method | None]) -> Handler:
    """A handler doing an exchange or queue operation and sending its reply (if any)."""

    def handle(channel: Channel, method: m.Method) -> None:
        reply = operation(channel.topology, method)
        if reply is not None:
            channel.host.send_method(channel.number, reply)

    return handle


def _durable(operation: Callable[[Topology, Any], m.Method | None]) -> DurableHandler:
    """A handler doing an exchange or queue operation now, and returning the wait for its
    durable changes to be written, after which the reply (if any) goes out."""

    def handle(channel: Channel, method: m.Method) -> Awaitable[None]:
        since = channel.vhost.definitions.mark()
        return _answer(channel, since, operation(channel.topology, method))

    return handle


def _opening(operation: Callable[[Topology, Any], Awaitable[m.Method | None]]) -> DurableHandler:
    """``_durable``, for an operation that awaits a store opening in a worker thread."""

    async def handle(channel: Channel, method: m.Method) -> None:
        since = channel.vhost.definitions.mark()
        await _answer(channel, since, await operation(channel.topology, method))

    return handle


async def _answer(channel: Channel, since: int, reply: m.Method | None) -> None:
    """Send ``reply`` once the durable changes made since ``since`` are written (541 if that
    failed); nothing if the channel closed meanwhile."""
    try:
        await channel.vhost.definitions.wait(since)
    except AMQPError:
        if channel.closed:
            return
        raise
    if reply is not None and not channel.closed:
        channel.host.send_method(channel.number, reply)


def _flow(channel: Channel, method: m.ChannelFlow) -> None:
    if not method.active:
        raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "active=false")
    channel.host.send_method(channel.number, m.ChannelFlowOk(True))


def _access_request(channel: Channel, _method: m.AccessRequest) -> None:
    channel.host.send_method(channel.number, m.AccessRequestOk(1))


def _ignore(_channel: Channel, _method: m.Method) -> None:
    """Answers to what the server sent: nothing to do."""


HANDLERS: dict[type[m.Method], Handler] = {
    m.BasicAck: Channel.basic_ack,
    m.BasicNack: Channel.basic_nack,
    m.BasicReject: Channel.basic_reject,
    m.BasicQos: Channel.basic_qos,
    m.BasicConsume: _checked(_consume_needs, Channel.basic_consume),
    m.BasicCancel: Channel.basic_cancel,
    m.BasicGet: _checked(_on_topology(access.queue_read), Channel.basic_get),
    m.BasicRecover: Channel.basic_recover,
    m.BasicRecoverAsync: Channel.basic_recover,
    m.QueuePurge: _checked(_on_topology(access.queue_read), _topology(Topology.queue_purge)),
    m.ConfirmSelect: Channel.confirm_select,
    m.TxSelect: Channel.tx_select,
    m.TxCommit: Channel.tx_commit,
    m.TxRollback: Channel.tx_rollback,
    m.ChannelFlow: _flow,
    m.AccessRequest: _access_request,
    m.BasicCancelOk: _ignore,
    m.ChannelFlowOk: _ignore,
}

# Methods that change durable topology: the connection's reader awaits them.
DURABLE_HANDLERS: dict[type[m.Method], Handler] = {
    m.QueueDeclare: _checked(_on_topology(access.queue_declare), _opening(Topology.queue_declare)),
    m.QueueBind: _checked(_on_topology(access.queue_bind), _durable(Topology.queue_bind)),
    m.QueueUnbind: _checked(_on_topology(access.queue_bind), _durable(Topology.queue_unbind)),
    m.QueueDelete: _checked(_on_topology(access.queue_delete), _durable(Topology.queue_delete)),
    m.ExchangeDeclare: _checked(
        _on_vhost(access.exchange_declare), _opening(Topology.exchange_declare)
    ),
    m.ExchangeDelete: _checked(
        _on_vhost(access.exchange_delete), _durable(Topology.exchange_delete)
    ),
    m.ExchangeBind: _checked(_on_vhost(access.exchange_bind), _durable(Topology.exchange_bind)),
    m.ExchangeUnbind: _checked(_on_vhost(access.exchange_bind), _durable(Topology.exchange_unbind)),
}
