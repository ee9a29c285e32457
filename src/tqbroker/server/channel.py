"""One open AMQP channel of a connection: the methods of the exchange, queue, basic, confirm and
tx classes, and the consumers and unacked deliveries that belong to the channel.

Responsibilities:
- turn methods into vhost operations and reply (``*-ok`` unless ``nowait``);
- publishing: exchange checks, routing, ``mandatory`` returns, publisher confirms (coalesced into
  one ``multiple`` ack per read batch), transactions;
- consuming: consumers and their prefetch, ``basic.get``, delivery tags, ack / nack / reject /
  recover, and requeueing everything unacked when the channel goes away;
- the delivery-acknowledgement timeout: when the oldest unacked delivery is due (``ack_deadline``;
  the connection closes the channel with 406 when it passes).

Every handler is synchronous and raises ``AMQPError`` to refuse; the connection closes the
channel or the connection accordingly.
"""

from __future__ import annotations

import base64
import logging
import math
import os
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs
import trio

from .. import clock
from ..broker.consumer import Consumer
from ..broker.deadletter import parse_expiration
from ..broker.exchange import Exchange
from ..broker.flusher import Flusher
from ..broker.queue import NEEDS_FLUSH, Queue
from ..broker.vhost import REPLY_TO, REPLY_TO_PREFIX, VirtualHost
from ..model import Message
from ..protocol import frames
from ..protocol.connection import check_properties
from ..protocol.errors import AMQPError, DecodeError, ReplyCode
from ..protocol.methods import (
    AccessRequest,
    AccessRequestOk,
    BasicAck,
    BasicCancel,
    BasicCancelOk,
    BasicConsume,
    BasicConsumeOk,
    BasicGet,
    BasicGetEmpty,
    BasicNack,
    BasicProperties,
    BasicPublish,
    BasicQos,
    BasicQosOk,
    BasicRecover,
    BasicRecoverAsync,
    BasicRecoverOk,
    BasicReject,
    ChannelFlow,
    ChannelFlowOk,
    ConfirmSelect,
    ConfirmSelectOk,
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
    TxCommit,
    TxCommitOk,
    TxRollback,
    TxRollbackOk,
    TxSelect,
    TxSelectOk,
)
from .encoding import write_deliver

if TYPE_CHECKING:
    from .connection import AMQPConnection

log = logging.getLogger(__name__)

# (queue, message id, consumer or None for basic.get, Trio time of the delivery)
Unacked = tuple[Queue, int, Consumer | None, float]

# The headers property's bit (0x2000) in the first byte of the property flags.
_HEADERS_FLAG_HIGH = 0x20
# What the default exchange is routed with (it reads only the routing key).
_NO_PROPERTIES = BasicProperties()


def _server_name(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Channel:
    def __init__(self, connection: AMQPConnection, number: int, vhost: VirtualHost) -> None:
        self.connection = connection
        self.number = number
        self.vhost = vhost
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict[int, Unacked] = {}
        self._next_tag = 1
        self.prefetch_count = 0  # for consumers created from now on
        self.global_prefetch = 0  # shared by the channel's deliveries
        self.confirm = False
        self.publish_seq = 0
        self.confirmed = 0  # every publish up to this one has been acked or nacked
        # Publishes that wait for a flush (or failed): [seq, [(flusher, ticket)], failed]
        self._pending_confirms: deque[tuple[int, list[tuple[Flusher, int]], list[bool]]] = deque()
        # tx.commit-ok waiting for durability: one list of (flusher, ticket) per commit
        self._pending_commits: deque[list[tuple[Flusher, int]]] = deque()
        self.tx: list[tuple[Exchange, Message, bool]] | None = None  # publishes awaiting commit
        # (tag, entry, settlement as in _settle: None ack, True requeue, False reject)
        self.tx_acks: list[tuple[int, Unacked, bool | None]] = []
        self._last_queue = ""
        self._tag_cache: dict[str, bytes] = {}
        # Direct reply-to: the consumer tag on amq.rabbitmq.reply-to and our reply address.
        self.reply_tag: str | None = None
        self.reply_address: str | None = None
        self.closed = False

    # -- dispatch ----------------------------------------------------------------------------

    def handle(self, method: Method) -> None:
        """Carry out one method; raises ``AMQPError`` to refuse it."""
        match method:
            case BasicAck(delivery_tag=tag, multiple=multiple):
                self._settle(self._take(tag, multiple), requeue=None)
            case BasicNack(delivery_tag=tag, multiple=multiple, requeue=requeue):
                self._settle(self._take(tag, multiple), requeue=requeue)
            case BasicReject(delivery_tag=tag, requeue=requeue):
                self._settle(self._take(tag, False), requeue=requeue)
            case BasicQos():
                self._qos(method)
            case BasicConsume():
                self._consume(method)
            case BasicCancel(consumer_tag=tag, nowait=nowait):
                self._cancel(tag)
                if not nowait:
                    self._send(BasicCancelOk(tag))
            case BasicGet():
                self._get(method)
            case BasicRecover(requeue=requeue) | BasicRecoverAsync(requeue=requeue):
                if not requeue:
                    raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "requeue=false")
                self._requeue_all()
                if isinstance(method, BasicRecover):
                    self._send(BasicRecoverOk())
            case QueueDeclare():
                self._queue_declare(method)
            case QueueBind():
                self.vhost.bind_queue(
                    self._queue_name(method.queue),
                    method.exchange,
                    method.routing_key or (self._last_queue if not method.queue else ""),
                    method.arguments,
                    self.connection,
                )
                self._reply(method.nowait, QueueBindOk())
            case QueueUnbind():
                self.vhost.unbind_queue(
                    self._queue_name(method.queue),
                    method.exchange,
                    method.routing_key,
                    method.arguments,
                    self.connection,
                )
                self._send(QueueUnbindOk())
            case QueuePurge():
                count = self.vhost.purge_queue(self._queue_name(method.queue), self.connection)
                self._reply(method.nowait, QueuePurgeOk(count))
            case QueueDelete():
                count = self.vhost.delete_queue(
                    self._queue_name(method.queue),
                    if_unused=method.if_unused,
                    if_empty=method.if_empty,
                    owner=self.connection,
                )
                self._reply(method.nowait, QueueDeleteOk(count))
            case ExchangeDeclare():
                self.vhost.declare_exchange(
                    method.exchange,
                    method.type,
                    passive=method.passive,
                    durable=method.durable,
                    auto_delete=method.auto_delete,
                    internal=method.internal,
                    arguments=method.arguments,
                )
                self._reply(method.nowait, ExchangeDeclareOk())
            case ExchangeDelete():
                self.vhost.delete_exchange(method.exchange, if_unused=method.if_unused)
                self._reply(method.nowait, ExchangeDeleteOk())
            case ExchangeBind():
                self.vhost.bind_exchange(
                    method.destination, method.source, method.routing_key, method.arguments
                )
                self._reply(method.nowait, ExchangeBindOk())
            case ExchangeUnbind():
                self.vhost.unbind_exchange(
                    method.destination, method.source, method.routing_key, method.arguments
                )
                self._reply(method.nowait, ExchangeUnbindOk())
            case ConfirmSelect(nowait=nowait):
                if self.tx is not None:
                    raise AMQPError(
                        ReplyCode.PRECONDITION_FAILED, "cannot switch from tx to confirm mode"
                    )
                self.confirm = True
                self._reply(nowait, ConfirmSelectOk())
            case TxSelect():
                if self.confirm:
                    raise AMQPError(
                        ReplyCode.PRECONDITION_FAILED, "cannot switch from confirm to tx mode"
                    )
                if self.tx is None:
                    self.tx = []
                self._send(TxSelectOk())
            case TxCommit():
                self._tx_commit()
            case TxRollback():
                self._tx_rollback()
                self._send(TxRollbackOk())
            case ChannelFlow(active=active):
                if not active:
                    raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "active=false")
                self._send(ChannelFlowOk(True))
            case AccessRequest():
                self._send(AccessRequestOk(1))
            case BasicCancelOk() | ChannelFlowOk():
                pass  # answers to what the server sent; nothing to do
            case _:
                raise AMQPError(
                    ReplyCode.COMMAND_INVALID, f"{method.NAME} is not a client-to-server method"
                )

    def _send(self, method: Method) -> None:
        self.connection.write(self.connection.protocol.send_method(self.number, method))

    def _reply(self, nowait: bool, method: Method) -> None:
        if not nowait:
            self._send(method)

    def _queue_name(self, name: str) -> str:
        """An empty queue name means the queue last declared on this channel."""
        if name:
            return name
        if not self._last_queue:
            raise AMQPError(ReplyCode.NOT_FOUND, "no previously declared queue")
        return self._last_queue

    # -- queues ------------------------------------------------------------------------------

    def _queue_declare(self, method: QueueDeclare) -> None:
        if method.queue == REPLY_TO:  # the direct reply-to pseudo-queue, as RabbitMQ answers
            self._reply(method.nowait, QueueDeclareOk(REPLY_TO, 0, 1))
            return
        queue = self.vhost.declare_queue(
            method.queue,
            passive=method.passive,
            durable=method.durable,
            exclusive=method.exclusive,
            auto_delete=method.auto_delete,
            arguments=method.arguments,
            owner=self.connection,
        )
        self._last_queue = queue.name
        self._reply(
            method.nowait, QueueDeclareOk(queue.name, queue.message_count, len(queue.consumers))
        )

    # -- publishing --------------------------------------------------------------------------

    def publish(
        self,
        method: BasicPublish,
        properties_raw: bytes,
        body: bytes,
        timestamp_ms: int | None = None,
    ) -> None:
        """Route (or hold, in a transaction) a published message. ``timestamp_ms``: when it
        arrived (``clock.now_ms()`` of the read that brought it; now if None)."""
        if method.immediate:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "immediate=true")
        exchange = self.vhost.get_exchange(method.exchange)
        if exchange.internal:
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"cannot publish to internal exchange '{exchange.name}' in vhost "
                f"'{self.vhost.name}'",
            )
        # Validated here as a full decode would (a bad block is refused before routing), but
        # decoded only if memoised or needed (reply-to, expiration, headers); else None: the
        # message decodes them if something asks.
        try:
            properties = check_properties(properties_raw)
        except DecodeError as exc:
            raise AMQPError(ReplyCode.FRAME_ERROR, f"cannot decode properties: {exc}") from None
        if properties is not None:
            if properties.reply_to == REPLY_TO:
                if self.reply_tag is None or self.reply_address is None:
                    raise AMQPError(
                        ReplyCode.PRECONDITION_FAILED, "fast reply consumer does not exist"
                    )
                properties = attrs.evolve(properties, reply_to=self.reply_address)
                properties_raw = properties.encode()
            if properties.expiration is not None:
                ttl = parse_expiration(properties.expiration)
                if isinstance(ttl, str):
                    raise AMQPError(
                        ReplyCode.PRECONDITION_FAILED,
                        f"invalid expiration '{properties.expiration}': {ttl}",
                    )
        message = Message(
            method.exchange,
            method.routing_key,
            properties_raw,
            body,
            properties,
            timestamp_ms=clock.now_ms() if timestamp_ms is None else timestamp_ms,
        )
        if self.tx is not None:
            self.tx.append((exchange, message, method.mandatory))
            return
        waits, refused = self._route(exchange, message, method.mandatory)
        if self.confirm:
            self.publish_seq += 1
            if waits or refused:
                self._pending_confirms.append((self.publish_seq, waits, [refused]))
                for flusher, _ticket in waits:
                    flusher.listen(self)
            self.connection.confirms_pending(self)

    def _route(
        self, exchange: Exchange, message: Message, mandatory: bool
    ) -> tuple[list[tuple[Flusher, int]], bool]:
        """Route and enqueue; return what a confirm must wait for, and whether a queue refused
        the message (its storage cannot write: the publish is nacked)."""
        vhost = self.vhost
        waits: list[tuple[Flusher, int]] = []
        refused = False
        if exchange is vhost.default_exchange and message.routing_key.startswith(REPLY_TO_PREFIX):
            routed = vhost.deliver_reply(message.routing_key, message)
        else:
            if message.properties_raw[0] & _HEADERS_FLAG_HIGH:
                # Sender-selected distribution: routed on CC and BCC keys too; BCC never
                # delivered.
                headers = message.properties.headers
                queues = vhost.route_keys(
                    exchange, message.routing_keys(bcc=True), message.properties
                )
                if headers and "BCC" in headers:
                    message = message.with_headers({k: v for k, v in headers.items() if k != "BCC"})
            else:
                # No headers: no CC or BCC keys. The default exchange routes by the routing key
                # alone, so properties a publish left undecoded stay so.
                queues = vhost.route(
                    exchange,
                    message.routing_key,
                    _NO_PROPERTIES if exchange is vhost.default_exchange else message.properties,
                )
            waits, refused = vhost.enqueue(queues, message)
            # A destination that holds the message to route it later (x-delayed-message) is not
            # a route yet: a mandatory message reaching only such is returned, as in RabbitMQ.
            routed = bool(queues) and (
                not mandatory or any(isinstance(queue, Queue) for queue in queues)
            )
        if not routed and mandatory:
            out = self.connection.out
            frames.write_return(
                out,
                self.number,
                ReplyCode.NO_ROUTE,
                "NO_ROUTE",
                message.exchange,
                message.routing_key,
                message.properties_raw,
                message.body,
                self.connection.protocol.frame_max,
            )
            self.connection.wake_writer()
        return waits, refused

    def flush_confirms(self) -> None:
        """Confirm, with as few ``basic.ack(multiple=True)`` as possible, every publish that is
        durable where it needs to be; nack those whose storage failed. Publishes are settled in
        order: nothing is acked past one that still waits for a flush."""
        pending = self._pending_confirms
        while pending:
            seq, waits, failed = pending[0]
            if failed[0]:
                self._ack_upto(seq - 1)
                self._send(BasicNack(seq, False, False))
                self.confirmed = seq
            elif not all(flusher.completed >= ticket for flusher, ticket in waits):
                break
            pending.popleft()
        self._ack_upto(pending[0][0] - 1 if pending else self.publish_seq)

    def _ack_upto(self, seq: int) -> None:
        if seq > self.confirmed:
            self._send(BasicAck(seq, seq - self.confirmed > 1))
            self.confirmed = seq

    # -- FlushListener (called by flushers) --------------------------------------------------

    def flushed(self, flusher: Flusher) -> None:
        try:
            if self._pending_confirms:
                self.flush_confirms()
            self._flush_commits()
        except Exception as exc:  # a bug: this connection closes, not the flusher
            self.connection.internal_error(exc, "publisher confirms")
        if not self._pending_confirms and not self._pending_commits:
            flusher.unlisten(self)

    def flush_failed(self, flusher: Flusher, upto: int) -> None:
        try:
            self._flush_failed(flusher, upto)
        except Exception as exc:  # a bug: this connection closes, not the flusher
            self.connection.internal_error(exc, "publisher confirms")

    def _flush_failed(self, flusher: Flusher, upto: int) -> None:
        for _seq, waits, failed in self._pending_confirms:
            if any(f is flusher and flusher.completed < t <= upto for f, t in waits):
                failed[0] = True
        self.flush_confirms()
        if any(
            f is flusher and flusher.completed < t <= upto
            for waits in self._pending_commits
            for f, t in waits
        ):
            self._fail_commit()

    def _tx_commit(self) -> None:
        """Route the transaction's publishes and settle its acks; ``tx.commit-ok`` goes out
        once every persistent message of it is durable (``_flush_commits``)."""
        if self.tx is None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        publishes, self.tx = self.tx, []
        waits: list[tuple[Flusher, int]] = []
        refused = False
        for exchange, message, mandatory in publishes:
            if self.vhost.exchanges.get(exchange.name) is exchange:
                publish_waits, publish_refused = self._route(exchange, message, mandatory)
                waits.extend(publish_waits)
                refused = refused or publish_refused
        acks, self.tx_acks = self.tx_acks, []
        for _tag, entry, settlement in acks:
            _settle_one(entry, settlement)
        if acks and self.global_prefetch:
            self._wake_queues()
        if refused:
            raise self._commit_error()
        self._pending_commits.append(waits)
        for flusher, _ticket in waits:
            flusher.listen(self)
        self._flush_commits()

    def _flush_commits(self) -> None:
        pending = self._pending_commits
        while pending and all(flusher.completed >= ticket for flusher, ticket in pending[0]):
            pending.popleft()
            self._send(TxCommitOk())

    @staticmethod
    def _commit_error() -> AMQPError:
        return AMQPError(
            ReplyCode.INTERNAL_ERROR,
            "the transaction's messages could not be stored durably",
            class_id=90,
            method_id=20,
            hard=False,
        )

    def _fail_commit(self) -> None:
        self._pending_commits.clear()
        self.connection.fail_channel(self._commit_error().on_method(self.number, 90, 20))

    def _tx_rollback(self) -> None:
        if self.tx is None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        self.tx = []
        # Rolled-back acks leave their deliveries unacknowledged.
        for tag, entry, _settlement in self.tx_acks:
            self.unacked[tag] = entry
        self.unacked = dict(sorted(self.unacked.items()))
        self.tx_acks = []
        self.connection.watch_ack_deadline(-math.inf)  # recompute: the oldest may be back

    # -- consuming ---------------------------------------------------------------------------

    def _qos(self, method: BasicQos) -> None:
        if method.prefetch_size:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self.global_prefetch = method.prefetch_count
        else:
            # As RabbitMQ: a per-consumer limit also lifts the channel-wide one.
            self.prefetch_count = method.prefetch_count
            self.global_prefetch = 0
        self._send(BasicQosOk())
        self._wake_queues()

    def _consume(self, method: BasicConsume) -> None:
        tag = method.consumer_tag or _server_name("amq.ctag-")
        if tag in self.consumers or tag == self.reply_tag:
            raise AMQPError(
                ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", hard=True
            )
        if method.queue == REPLY_TO:
            self._consume_replies(tag, method)
            return
        queue = self.vhost.get_queue(self._queue_name(method.queue), self.connection)
        for name, low in (("x-priority", None), ("x-consumer-timeout", 0)):
            value = method.arguments.get(name)
            if value is not None and (
                not isinstance(value, int)
                or isinstance(value, bool)
                or (low is not None and value < low)
            ):
                required = "an integer" if low is None else f"an integer >= {low}"
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid arg '{name}' for consumer on queue '{queue.name}': {required} is "
                    f"required (got {value!r})",
                )
        queue.check_consumer(
            method.consumer_tag,
            no_ack=method.no_ack,
            prefetch_count=self.prefetch_count,
            arguments=method.arguments,
        )
        if queue.has_exclusive_consumer or (method.exclusive and queue.consumers):
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"queue '{queue.name}' in vhost '{self.vhost.name}' in exclusive use",
            )
        consumer = Consumer(
            tag,
            queue,
            self,
            no_ack=method.no_ack,
            exclusive=method.exclusive,
            prefetch_count=self.prefetch_count,
            arguments=method.arguments,
        )
        # consume-ok goes out before the first delivery: the queue actor runs after this.
        self._reply(method.nowait, BasicConsumeOk(tag))
        self.consumers[tag] = consumer
        queue.add_consumer(consumer)

    def _consume_replies(self, tag: str, method: BasicConsume) -> None:
        """Start consuming from the direct reply-to pseudo-queue (no-ack only, one per channel)."""
        if not method.no_ack:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.reply_tag is not None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "reply consumer already set")
        self._reply(method.nowait, BasicConsumeOk(tag))
        self.reply_tag = tag
        if self.reply_address is None:
            self.reply_address = self.vhost.register_reply_consumer(self)

    def deliver_reply(self, message: Message) -> None:
        """Deliver a reply sent to our direct reply-to address (no ack expected)."""
        if self.reply_tag is not None:
            try:
                self._write_deliver(self.reply_tag, self._next_tag, False, message)
            except Exception as exc:  # a bug: this connection closes, not the publisher's
                self.connection.internal_error(exc, "basic.deliver")
            self._next_tag += 1

    def _cancel(self, tag: str) -> None:
        self._tag_cache.pop(tag, None)
        if tag == self.reply_tag:
            self.reply_tag = None
            return
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)

    def _get(self, method: BasicGet) -> None:
        queue = self.vhost.get_queue(self._queue_name(method.queue), self.connection)
        self._answer_get(queue, method.no_ack)

    def _answer_get(self, queue: Queue, no_ack: bool) -> None:
        if self.closed or queue.deleted:
            return
        entry = queue.get()
        if entry is NEEDS_FLUSH:
            # The store must flush before it hands out more: answer after the flush.
            assert queue.flusher is not None
            queue.flusher.call_after_flush(lambda: self._answer_get_later(queue, no_ack))
            return
        if entry is None:
            self._send(BasicGetEmpty())
            return
        message_id, message, redelivered = entry
        tag = self._next_tag
        self._next_tag += 1
        if no_ack:
            queue.ack(message_id, None)
        else:
            self._track(tag, (queue, message_id, None, trio.current_time()))
        frames.write_get_ok(
            self.connection.out,
            self.number,
            tag,
            redelivered,
            message.exchange,
            message.routing_key,
            queue.message_count,
            message.properties_raw,
            message.body,
            self.connection.protocol.frame_max,
        )
        self.connection.wake_writer()

    def _answer_get_later(self, queue: Queue, no_ack: bool) -> None:
        try:
            self._answer_get(queue, no_ack)
        except Exception as exc:  # a bug: this connection closes, not the flusher
            self.connection.internal_error(exc, "basic.get")

    def _take(self, tag: int, multiple: bool) -> list[tuple[int, Unacked]]:
        """Remove and return the deliveries an ack/nack/reject refers to."""
        unacked = self.unacked
        if multiple and tag == 0:
            taken = list(unacked.items())
            unacked.clear()
            return taken
        if tag not in unacked:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        if not multiple:
            return [(tag, unacked.pop(tag))]
        taken = []
        for t in unacked:
            if t > tag:
                break
            taken.append((t, unacked[t]))
        for t, _ in taken:
            del unacked[t]
        return taken

    def _settle(self, taken: Iterable[tuple[int, Unacked]], requeue: bool | None) -> None:
        """Ack (``requeue`` None), requeue (True) or reject (False: the queue dead-letters or
        drops them) deliveries."""
        if self.tx is not None:
            self.tx_acks.extend((tag, entry, requeue) for tag, entry in taken)
            return
        for _tag, entry in taken:
            _settle_one(entry, requeue)
        if self.global_prefetch:
            self._wake_queues()

    def _requeue_all(self) -> None:
        taken = list(self.unacked.items())
        self.unacked.clear()
        self._settle_now(taken)
        self._wake_queues()

    @staticmethod
    def _settle_now(taken: list[tuple[int, Unacked]]) -> None:
        for _tag, (queue, message_id, consumer, _at) in taken:
            queue.requeue(message_id, consumer)

    def _track(self, tag: int, entry: Unacked) -> None:
        if not self.unacked:  # a new oldest delivery: its deadline may be the connection's next
            queue, _message_id, consumer, delivered_at = entry
            timeout = self._ack_timeout_ms(queue, consumer)
            if timeout is not None:
                self.connection.watch_ack_deadline(delivered_at + timeout / 1000)
        self.unacked[tag] = entry

    def _ack_timeout_ms(self, queue: Queue, consumer: Consumer | None) -> int | None:
        """The delivery-acknowledgement timeout: the consumer's ``x-consumer-timeout``
        argument, else the queue's, else the broker's (None: never), as in RabbitMQ."""
        if consumer is not None and consumer.timeout_ms is not None:
            return consumer.timeout_ms
        if queue.consumer_timeout_ms is not None:
            return queue.consumer_timeout_ms
        return self.connection.broker.config.consumer_timeout_ms

    def ack_deadline(self) -> tuple[float, int] | None:
        """When the oldest unacked delivery times out (Trio time) and the timeout used (ms).
        Only the oldest is watched, as RabbitMQ does: a younger delivery with a shorter
        timeout waits for it."""
        for queue, _message_id, consumer, delivered_at in self.unacked.values():
            timeout = self._ack_timeout_ms(queue, consumer)
            return None if timeout is None else (delivered_at + timeout / 1000, timeout)
        return None

    def _wake_queues(self) -> None:
        for consumer in self.consumers.values():
            consumer.queue.wake()

    # -- DeliveryChannel (called by queue actors) --------------------------------------------

    def can_deliver(self) -> bool:
        if self.global_prefetch and len(self.unacked) >= self.global_prefetch:
            return False
        return self.connection.can_write()

    def deliver(
        self, consumer: Consumer, message_id: int, message: Message, redelivered: bool
    ) -> None:
        try:
            tag = self._next_tag
            self._next_tag += 1
            if not consumer.no_ack:  # tracked first: requeued if the rest fails
                self._track(tag, (consumer.queue, message_id, consumer, trio.current_time()))
            self._write_deliver(consumer.tag, tag, redelivered, message)
        except Exception as exc:  # a bug: this connection closes, not the queue actor
            self.connection.internal_error(exc, "basic.deliver")

    def _write_deliver(
        self, consumer_tag: str, delivery_tag: int, redelivered: bool, message: Message
    ) -> None:
        encoded_tag = self._tag_cache.get(consumer_tag)
        if encoded_tag is None:
            encoded_tag = self._tag_cache[consumer_tag] = frames.shortstr(consumer_tag)
        connection = self.connection
        out = connection.out
        # The writer, once woken, sends what ``out`` holds until it is empty (every append to
        # it wakes the writer): only the delivery that finds it empty needs to wake it, once
        # per send rather than once per delivery.
        idle = not out
        # A message delivered again on this channel number (fanout, requeue) reuses its
        # content frames' heads, encoded at its second delivery.
        write_deliver(
            out,
            message,
            self.number,
            encoded_tag,
            delivery_tag,
            redelivered,
            connection.protocol.frame_max,
        )
        if idle:
            connection.wake_writer()

    def consumer_cancelled(self, consumer: Consumer) -> None:
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.connection.capabilities.get("consumer_cancel_notify") is True:
            try:
                self._send(BasicCancel(consumer.tag, True))
            except Exception as exc:  # a bug: this connection closes, not the queue's deleter
                self.connection.internal_error(exc, "basic.cancel")

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """The channel is gone: cancel its consumers and requeue what it left unacked."""
        self.closed = True
        for consumer in self.consumers.values():
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        taken = list(self.unacked.items())
        taken.extend((tag, entry) for tag, entry, _ in self.tx_acks)
        self.unacked.clear()
        self.tx_acks = []
        self.tx = None
        self._settle_now(taken)
        for _seq, waits, _failed in self._pending_confirms:
            for flusher, _ticket in waits:
                flusher.unlisten(self)
        self._pending_confirms.clear()
        self._pending_commits.clear()
        self.reply_tag = None
        if self.reply_address is not None:
            self.vhost.reply_consumers.pop(self.reply_address, None)


def _settle_one(entry: Unacked, settlement: bool | None) -> None:
    """Ack (None), requeue (True) or reject (False) one delivery."""
    queue, message_id, consumer, _delivered_at = entry
    if settlement is None:
        queue.ack(message_id, consumer)
    elif settlement:
        queue.requeue(message_id, consumer)
    else:
        queue.reject(message_id, consumer)
