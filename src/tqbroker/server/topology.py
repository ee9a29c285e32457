"""The exchange and queue class methods of one channel: each a vhost operation and its reply.

Responsibilities:
- ``queue.*`` and ``exchange.*``: the vhost call with the method's arguments, then the ``*-ok``
  to send (None with ``nowait``); raises ``AMQPError`` to refuse; ``queue.declare`` (and
  ``exchange.declare`` of a holding type) awaits a new store opening in a worker thread (the
  channel sends the reply once the change is written);
- the queue last declared on the channel, which an empty queue name means (and an empty routing
  key of a ``queue.bind`` with an empty queue name);
- the direct reply-to pseudo-queue's declare (answered as RabbitMQ does);
- the queue a ``basic.consume`` may consume from (``consumer_queue``).
"""

from __future__ import annotations

import logging

from ..broker.arguments import check_consumer_arguments
from ..broker.declaring import open_and_declare_queue
from ..broker.holding import open_holding_store
from ..broker.queue import Queue
from ..broker.reply_to import REPLY_TO
from ..broker.vhost import VirtualHost
from ..protocol.errors import AMQPError, ReplyCode
from ..protocol.methods import (
    BasicConsume,
    ExchangeBind,
    ExchangeBindOk,
    ExchangeDeclare,
    ExchangeDeclareOk,
    ExchangeDelete,
    ExchangeDeleteOk,
    ExchangeUnbind,
    ExchangeUnbindOk,
    Method,
    QueueBind,
    QueueBindOk,
    QueueDeclare,
    QueueDeclareOk,
    QueueDelete,
    QueueDeleteOk,
    QueuePurge,
    QueuePurgeOk,
    QueueUnbind,
    QueueUnbindOk,
)

log = logging.getLogger(__name__)


def _reply(nowait: bool, method: Method) -> Method | None:
    return None if nowait else method


class Topology:
    """One channel's view of the vhost's exchanges and queues. ``owner``: the connection, which
    owns the exclusive queues it declares."""

    def __init__(self, vhost: VirtualHost, owner: object) -> None:
        self.vhost = vhost
        self.owner = owner
        self.last_queue = ""

    def queue_name(self, name: str) -> str:
        """An empty queue name means the queue last declared on this channel."""
        if name:
            return name
        if not self.last_queue:
            raise AMQPError(ReplyCode.NOT_FOUND, "no previously declared queue")
        return self.last_queue

    # -- queues ------------------------------------------------------------------------------

    async def queue_declare(self, method: QueueDeclare) -> Method | None:
        if method.queue == REPLY_TO:  # the direct reply-to pseudo-queue, as RabbitMQ answers
            return _reply(method.nowait, QueueDeclareOk(REPLY_TO, 0, 1))
        queue = await open_and_declare_queue(
            self.vhost,
            method.queue,
            passive=method.passive,
            durable=method.durable,
            exclusive=method.exclusive,
            auto_delete=method.auto_delete,
            arguments=method.arguments,
            owner=self.owner,
        )
        self.last_queue = queue.name
        return _reply(
            method.nowait, QueueDeclareOk(queue.name, queue.message_count, len(queue.consumers))
        )

    def queue_bind(self, method: QueueBind) -> Method | None:
        self.vhost.bind_queue(
            self.queue_name(method.queue),
            method.exchange,
            method.routing_key or (self.last_queue if not method.queue else ""),
            method.arguments,
            self.owner,
        )
        return _reply(method.nowait, QueueBindOk())

    def queue_unbind(self, method: QueueUnbind) -> Method | None:
        self.vhost.unbind_queue(
            self.queue_name(method.queue),
            method.exchange,
            method.routing_key,
            method.arguments,
            self.owner,
        )
        return QueueUnbindOk()

    def queue_purge(self, method: QueuePurge) -> Method | None:
        count = self.vhost.purge_queue(self.queue_name(method.queue), self.owner)
        return _reply(method.nowait, QueuePurgeOk(count))

    def queue_delete(self, method: QueueDelete) -> Method | None:
        count = self.vhost.delete_queue(
            self.queue_name(method.queue),
            if_unused=method.if_unused,
            if_empty=method.if_empty,
            owner=self.owner,
        )
        return _reply(method.nowait, QueueDeleteOk(count))

    def consumer_queue(self, method: BasicConsume, prefetch_count: int) -> Queue:
        """The queue a ``basic.consume`` consumes from, once the consumer passed its checks
        (arguments, the queue's own, exclusive use)."""
        queue = self.vhost.get_queue(self.queue_name(method.queue), self.owner)
        check_consumer_arguments(queue.name, self.vhost.name, method.arguments)
        queue.check_usable()
        queue.check_consumer(
            method.consumer_tag,
            no_ack=method.no_ack,
            prefetch_count=prefetch_count,
            arguments=method.arguments,
        )
        if queue.has_exclusive_consumer or (method.exclusive and queue.consumers):
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"queue '{queue.name}' in vhost '{self.vhost.name}' in exclusive use",
            )
        return queue

    # -- exchanges ---------------------------------------------------------------------------

    async def exchange_declare(self, method: ExchangeDeclare) -> Method | None:
        if not method.passive:
            await open_holding_store(
                self.vhost,
                method.exchange,
                method.type,
                durable=method.durable,
                arguments=method.arguments,
            )
        self.vhost.declare_exchange(
            method.exchange,
            method.type,
            passive=method.passive,
            durable=method.durable,
            auto_delete=method.auto_delete,
            internal=method.internal,
            arguments=method.arguments,
        )
        return _reply(method.nowait, ExchangeDeclareOk())

    def exchange_delete(self, method: ExchangeDelete) -> Method | None:
        self.vhost.delete_exchange(method.exchange, if_unused=method.if_unused)
        return _reply(method.nowait, ExchangeDeleteOk())

    def exchange_bind(self, method: ExchangeBind) -> Method | None:
        self.vhost.bind_exchange(
            method.destination, method.source, method.routing_key, method.arguments
        )
        return _reply(method.nowait, ExchangeBindOk())

    def exchange_unbind(self, method: ExchangeUnbind) -> Method | None:
        self.vhost.unbind_exchange(
            method.destination, method.source, method.routing_key, method.arguments
        )
        return _reply(method.nowait, ExchangeUnbindOk())
