"""One open AMQP channel of a connection: the handlers of its methods (named for them:
``basic_ack`` handles ``basic.ack``; ``dispatch.py`` says which handles what), its consumers,
and the parts of its state kept apart.

Responsibilities:
- publishing (checked and made by ``publishing.py``, published by the broker's
  ``Routing.publish_run``) into the transaction (``transactions.py``) or the queues, with
  publisher confirms (``confirms.py``) and ``mandatory`` returns;
- consumers (kept by tag and by queue, ``channel_consumers.py``) and their prefetch,
  ``basic.get``, ack / nack / reject / recover over the channel's deliveries
  (``deliveries.py``), and requeueing everything unacked when the channel goes away;
- deliveries from queue actors (``DeliveryChannel``); direct reply-to (``reply_to.py``);
- the exchange and queue methods (``topology.py``).

A channel reaches its connection only through ``ChannelHost``.

Over 400 lines as one job: each method handler is a few lines over the parts named above;
the handlers are kept together so that ``dispatch.py``'s table points into one class.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Awaitable
from typing import Final

import trio

from .. import clock
from ..backends.base import FLUSH_FIRST, Popped
from ..broker.consumer import UNLIMITED, Consumer, EncodedDelivery
from ..broker.exchange import Exchange
from ..broker.pacing import Pacer
from ..broker.queue import Queue
from ..broker.reply_to import REPLY_TO
from ..broker.stats import MessageStats
from ..broker.vhost import VirtualHost
from ..model import Message
from ..protocol import frames
from ..protocol import methods as m
from ..protocol.errors import AMQPError, ReplyCode
from .access import TOPIC, ChannelAccess
from .channel_consumers import ChannelConsumers
from .channel_host import ChannelHost
from .confirms import PublisherConfirms, Wait
from .deliveries import Deliveries, Delivery, Settlement, Taken, settle
from .publishing import make_messages, publish_exchange
from .reply_to import ReplyTo
from .topology import Topology
from .transactions import Transaction, commit_error

log = logging.getLogger(__name__)

# A closing channel's consumers leave this many queues at a time between two yields
# (``close_paced``; at most ``CONSUMERS_PER_STEP`` consumers of one queue a step).
QUEUES_PER_STEP: Final = 100


def _server_name(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Channel:
    """One open channel: the ``DeliveryChannel`` of its consumers (queue actors call
    ``credit``, ``deliver``, ``consumer_cancelled``)."""

    def __init__(
        self, host: ChannelHost, number: int, vhost: VirtualHost, access: ChannelAccess
    ) -> None:
        self.host = host
        self.number = number
        self.vhost = vhost
        self.access = access  # the user's permission checks (``access.py``)
        self.topology = Topology(vhost, host)
        self.deliveries = Deliveries(host)
        self.consumers = ChannelConsumers()
        self.prefetch_count = 0  # for consumers created from now on
        self.global_prefetch = 0  # shared by the channel's deliveries
        self.confirms: PublisherConfirms | None = None  # after confirm.select
        self.tx: Transaction | None = None  # after tx.select
        self.reply_to = ReplyTo(vhost, self._deliver_reply)
        self._tag_cache: dict[str, bytes] = {}  # consumer tags as shortstrs
        # Trio's time (what ``trio.current_time`` returns) in one call rather than three: it
        # stamps every delivery.
        self._now = trio.lowlevel.current_clock().current_time
        self.closed = False
        # Message counters (``broker/stats.py``), part of the connection's total.
        self.stats = MessageStats()
        host.stats.add(self.stats)

    def _send(self, method: m.Method) -> None:
        self.host.send_method(self.number, method)

    def _reply(self, nowait: bool, method: m.Method) -> None:
        if not nowait:
            self._send(method)

    def wake_queues(self) -> None:
        """The channel may take deliveries again: tell the queues it consumes from."""
        for queue in self.consumers.queues():
            queue.channel_ready(self)

    # -- publishing --------------------------------------------------------------------------

    def publish(
        self,
        method: m.BasicPublish,
        properties: list[bytes],
        bodies: list[bytes],
        timestamp_ms: int | None = None,
    ) -> Awaitable[None] | None:
        """Route (or hold, in a transaction) published messages, in order: one per body
        (``properties[i]`` are the raw properties of ``bodies[i]``), all with ``method``.
        ``timestamp_ms``: when they arrived (``clock.now_ms()`` of the read that brought them;
        now if None). The user's permissions are checked first, once (``access.py``); when the
        channel's cache cannot answer, this returns what to await (the checks, then the
        publishes)."""
        if timestamp_ms is None:
            timestamp_ms = clock.now_ms()
        if method.immediate:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "immediate=true")
        if self.access.writes(method.exchange) is not True:
            return self._publish_after_checks(method, properties, bodies, timestamp_ms)
        exchange = publish_exchange(self.vhost, method)
        if (
            exchange.type_name == TOPIC
            and self.access.topic_writes(exchange.name, method.routing_key) is not True
        ):
            return self._publish_after_checks(method, properties, bodies, timestamp_ms)
        self._publish(exchange, method, properties, bodies, timestamp_ms)
        return None

    async def _publish_after_checks(
        self,
        method: m.BasicPublish,
        properties: list[bytes],
        bodies: list[bytes],
        timestamp_ms: int,
    ) -> None:
        """``publish`` with its permission checks asked of the auth backends (RabbitMQ's
        order: write on the exchange, the exchange found and not internal, topic write)."""
        access = self.access
        await access.check_write(method.exchange)
        exchange = publish_exchange(self.vhost, method)
        if exchange.type_name == TOPIC:
            await access.check_topic_write(exchange.name, method.routing_key)
        if not self.closed:
            self._publish(exchange, method, properties, bodies, timestamp_ms)

    def _publish(
        self,
        exchange: Exchange,
        method: m.BasicPublish,
        properties: list[bytes],
        bodies: list[bytes],
        timestamp_ms: int,
    ) -> None:
        # The channel closes on a refusal: the publishes before it still go.
        messages, refusal = make_messages(method, properties, bodies, timestamp_ms, self.reply_to)
        stats, mandatory = self.stats, method.mandatory
        stats.publish += len(messages)
        if self.tx is not None:
            self.tx.publishes += [(exchange, message, mandatory) for message in messages]
        elif messages:
            confirmed = self.vhost.routing.publish_run(
                exchange, messages, mandatory, stats, self._write_return
            )
            confirms = self.confirms
            if confirms is not None:
                for count, waits, refused in confirmed:
                    confirms.published(waits, refused, count)
                self.host.confirms_pending(self)
        if refusal is not None:
            raise refusal

    def _route(
        self, exchange: Exchange, message: Message, mandatory: bool
    ) -> tuple[list[Wait], bool]:
        waits, refused, returned, _ = self.vhost.routing.publish(
            exchange, message, mandatory, self.stats
        )
        if returned is not None:
            self._write_return(returned)
        return waits, refused

    def _write_return(self, message: Message) -> None:
        self.host.write_return(self.number, message)

    def flush_confirms(self) -> None:
        if self.confirms is not None:
            self.confirms.flush()

    def confirm_select(self, method: m.ConfirmSelect) -> None:
        if self.tx is not None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        if self.confirms is None:
            self.confirms = PublisherConfirms(self._send, self.host.internal_error, self.stats)
        self._reply(method.nowait, m.ConfirmSelectOk())

    def tx_select(self, _method: m.TxSelect) -> None:
        if self.confirms is not None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction(
                self.number, self._send, self.host.fail_channel, self.host.internal_error
            )
        self._send(m.TxSelectOk())

    def _transaction(self) -> Transaction:
        if self.tx is None:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        return self.tx

    def tx_commit(self, _method: m.TxCommit) -> None:
        """Route the transaction's publishes and settle its acks; ``tx.commit-ok`` goes out
        once every persistent message of it is durable."""
        settled, refused = self._transaction().commit(self._route, self.vhost.exchanges)
        if settled and self.global_prefetch:
            self.wake_queues()
        if refused:
            raise commit_error()

    def tx_rollback(self, _method: m.TxRollback) -> None:
        self.deliveries.restore(self._transaction().rollback())
        self._send(m.TxRollbackOk())

    # -- consuming ---------------------------------------------------------------------------

    def basic_qos(self, method: m.BasicQos) -> None:
        if method.prefetch_size:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self.global_prefetch = method.prefetch_count
        else:
            # As RabbitMQ: a per-consumer limit also lifts the channel-wide one.
            self.prefetch_count = method.prefetch_count
            self.global_prefetch = 0
        self._send(m.BasicQosOk())
        self.wake_queues()

    def basic_consume(self, method: m.BasicConsume) -> None:
        tag = method.consumer_tag or _server_name("amq.ctag-")
        if tag in self.consumers or tag == self.reply_to.tag:
            raise AMQPError(
                ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", hard=True
            )
        if method.queue == REPLY_TO:
            self.reply_to.check_consume(method.no_ack)
            self._reply(method.nowait, m.BasicConsumeOk(tag))
            self.reply_to.started(tag)
            return
        queue = self.topology.consumer_queue(method, self.prefetch_count)
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
        self._reply(method.nowait, m.BasicConsumeOk(tag))
        self.consumers.add(consumer)
        queue.add_consumer(consumer)

    def basic_cancel(self, method: m.BasicCancel) -> None:
        tag = method.consumer_tag
        self._tag_cache.pop(tag, None)
        if not self.reply_to.cancel(tag):
            consumer = self.consumers.get(tag)
            if consumer is not None:
                self.consumers.forget(consumer)
                consumer.queue.remove_consumer(consumer)
        self._reply(method.nowait, m.BasicCancelOk(tag))

    def basic_get(self, method: m.BasicGet) -> None:
        queue = self.vhost.get_queue(self.topology.queue_name(method.queue), self.host)
        queue.check_usable()
        self._answer_get(queue, method.no_ack)

    def _answer_get(self, queue: Queue, no_ack: bool) -> None:
        if self.closed or queue.deleted:
            return
        entry = queue.get()
        if entry is FLUSH_FIRST:
            # The store must flush before it hands out more: answer after the flush.
            assert queue.flusher is not None
            queue.flusher.call_after_flush(lambda: self._answer_get_later(queue, no_ack))
            return
        stats, queue_stats = self.stats, queue.stats
        if entry is None:
            stats.get_empty += 1
            queue_stats.get_empty += 1
            self._send(m.BasicGetEmpty())
            return
        message_id, message, redelivered = entry
        deliveries = self.deliveries
        tag = deliveries.next_tag
        deliveries.next_tag = tag + 1
        if redelivered:
            stats.redeliver += 1
            queue_stats.redeliver += 1
        if no_ack:
            stats.get_no_ack += 1
            queue_stats.get_no_ack += 1
            queue.ack(message_id, None)
        else:
            stats.get += 1
            queue_stats.get += 1
            deliveries.track(tag, Delivery(queue, message_id, None, self._now()))
        self.host.write_get_ok(self.number, tag, redelivered, message, queue.message_count)

    def _answer_get_later(self, queue: Queue, no_ack: bool) -> None:
        try:
            self._answer_get(queue, no_ack)
        except Exception as exc:  # a bug: this connection closes, not the flusher
            self.host.internal_error(exc, "basic.get")

    # -- settling ----------------------------------------------------------------------------

    def basic_ack(self, method: m.BasicAck) -> None:
        taken = self.deliveries.take(method.delivery_tag, method.multiple)
        self.stats.ack += len(taken)  # the queues count theirs as they settle (``settle``)
        self._settle(taken, Settlement.ACK)

    def basic_nack(self, method: m.BasicNack) -> None:
        taken = self.deliveries.take(method.delivery_tag, method.multiple)
        self._settle(taken, Settlement.refused(method.requeue))

    def basic_reject(self, method: m.BasicReject) -> None:
        taken = self.deliveries.take(method.delivery_tag, False)
        self._settle(taken, Settlement.refused(method.requeue))

    def _settle(self, taken: Taken, settlement: Settlement) -> None:
        if self.tx is not None:
            self.tx.settle(taken, settlement)
            return
        settle(taken, settlement)
        if self.global_prefetch:
            self.wake_queues()

    def basic_recover(self, method: m.BasicRecover | m.BasicRecoverAsync) -> None:
        if not method.requeue:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "requeue=false")
        settle(self.deliveries.take_all(), Settlement.REQUEUE)
        self.wake_queues()
        if isinstance(method, m.BasicRecover):
            self._send(m.BasicRecoverOk())

    # -- DeliveryChannel (called by queue actors) --------------------------------------------

    def deliver(
        self, consumer: Consumer, message_id: int, message: Message, redelivered: bool
    ) -> None:
        try:
            deliveries = self.deliveries
            tag = deliveries.next_tag
            deliveries.next_tag = tag + 1
            stats, queue_stats = self.stats, consumer.queue.stats
            if consumer.no_ack:
                stats.deliver_no_ack += 1
                queue_stats.deliver_no_ack += 1
            else:  # tracked first: requeued if the rest fails
                stats.deliver += 1
                queue_stats.deliver += 1
                delivery = Delivery(consumer.queue, message_id, consumer, self._now())
                deliveries.track(tag, delivery)
            if redelivered:
                stats.redeliver += 1
                queue_stats.redeliver += 1
            encoded_tag = self._tag_cache.get(consumer.tag) or self._encode_tag(consumer.tag)
            self.host.write_deliver(self.number, encoded_tag, tag, redelivered, message)
        except Exception as exc:  # a bug: this connection closes, not the queue actor
            self.host.internal_error(exc, "basic.deliver")

    def credit(self) -> int:
        if self.closed or not self.host.can_write():
            return 0
        if self.global_prefetch:
            return max(self.global_prefetch - len(self.deliveries.unacked), 0)
        return UNLIMITED

    def deliver_many(self, consumer: Consumer, entries: list[Popped]) -> None:
        """``deliver`` for a batch: the counters, the tags and the writer's wake-up once."""
        try:
            first, encoded_tag = self._account(consumer, [e[0] for e in entries])
            redelivered = self.host.write_delivers(self.number, encoded_tag, first, entries)
            if redelivered:
                self.stats.redeliver += redelivered
                consumer.queue.stats.redeliver += redelivered
        except Exception as exc:  # a bug: this connection closes, not the queue actor
            self.host.internal_error(exc, "basic.deliver")

    def deliver_encoded(self, consumer: Consumer, entries: list[EncodedDelivery]) -> None:
        """``deliver_many`` of messages given as their encoded parts."""
        try:
            first, encoded_tag = self._account(consumer, [e[0] for e in entries])
            self.host.write_encoded_delivers(self.number, encoded_tag, first, entries)
        except Exception as exc:  # a bug: this connection closes, not the queue actor
            self.host.internal_error(exc, "basic.deliver")

    def _account(self, consumer: Consumer, message_ids: list[int]) -> tuple[int, bytes]:
        """Take delivery tags for a batch of ``message_ids`` to ``consumer``, count them and
        track them (unless ``no_ack``); the first tag and the consumer's encoded tag."""
        deliveries = self.deliveries
        first = deliveries.next_tag
        count = len(message_ids)
        deliveries.next_tag = first + count
        stats, queue_stats = self.stats, consumer.queue.stats
        if consumer.no_ack:
            stats.deliver_no_ack += count
            queue_stats.deliver_no_ack += count
        else:  # tracked first: requeued if the rest fails
            stats.deliver += count
            queue_stats.deliver += count
            deliveries.track_many(first, consumer, message_ids, self._now())
        return first, self._tag_cache.get(consumer.tag) or self._encode_tag(consumer.tag)

    def _encode_tag(self, consumer_tag: str) -> bytes:
        encoded = self._tag_cache[consumer_tag] = frames.shortstr(consumer_tag)
        return encoded

    def _deliver_reply(self, consumer_tag: str, message: Message) -> None:
        """A reply for our direct reply-to consumer (no ack expected)."""
        tag = self.deliveries.next_tag
        self.deliveries.next_tag = tag + 1
        self.stats.deliver_no_ack += 1
        try:
            encoded_tag = self._tag_cache.get(consumer_tag) or self._encode_tag(consumer_tag)
            self.host.write_deliver(self.number, encoded_tag, tag, False, message)
        except Exception as exc:  # a bug: this connection closes, not the publisher's
            self.host.internal_error(exc, "basic.deliver")

    def consumer_cancelled(self, consumer: Consumer) -> None:
        if self.consumers.get(consumer.tag) is not consumer:
            return
        self.consumers.forget(consumer)
        if self.host.notifies_cancel:
            try:
                self._send(m.BasicCancel(consumer.tag, True))
            except Exception as exc:  # a bug: this connection closes, not the queue's deleter
                self.host.internal_error(exc, "basic.cancel")

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """The channel is gone: cancel its consumers and requeue what it left unacked."""
        self.closed = True
        for queue, consumers in self.consumers.take_all():
            queue.remove_consumers(consumers)
        self._release()

    async def close_paced(self) -> None:
        """``close``, giving way to other tasks after every ``QUEUES_PER_STEP`` queues or
        ``CONSUMERS_PER_STEP`` consumers (or a slice): a channel with 100k consumers closes
        without stalling anyone (each queue it leaves may wake its actor, which runs in the
        next round). Meanwhile its consumers take no delivery (``credit`` is 0). Cancelled,
        it finishes at once."""
        self.closed = True
        pacer = Pacer(max_items=QUEUES_PER_STEP)
        steps = self.consumers.take_all()
        try:
            for queue, consumers in steps:
                queue.remove_consumers(consumers)
                await pacer.step()
        finally:
            for queue, consumers in steps:
                queue.remove_consumers(consumers)
            self._release()

    def _release(self) -> None:
        """What ``close`` does once the consumers are gone: requeue what the channel left
        unacked, drop its confirms and transaction, fold its counters into the connection's."""
        taken = self.deliveries.take_all()
        if self.tx is not None:
            taken.extend(self.tx.close())
            self.tx = None
        settle(taken, Settlement.REQUEUE)
        if self.confirms is not None:
            self.confirms.close()
            self.confirms = None  # it holds our bound method: a reference cycle
        self.reply_to.close()
        self.host.stats.remove(self.stats)  # its counts stay in the connection's
