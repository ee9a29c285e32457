"""Queues: what every kind has (``Queue``) and what it needs of its vhost (``QueueHost``).

Responsibilities:
- ``Queue``: identity, lifetime (exclusive, auto-delete), bindings, consumers in priority order
  (a ``ConsumerRoster``; exclusive consumers, auto-delete once the last consumer leaves), the
  actor's wake-up (``wake``, and ``channel_ready`` from a consumer's channel); the
  kinds are ``ClassicQueue`` (``broker/classic.py``) and ``StreamQueue``
  (``broker/streams/queue.py``);
- ``QueueHost``: the vhost's side, passed in at construction: dead-lettering, and deleting an
  unused queue;
- what a full queue answers (``QueueFull``).

A queue reads its arguments from the typed ``QueueArguments`` built at declare time
(``broker/arguments.py``), never from the raw table.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Protocol

import trio

from ..backends.base import FlushFirst, Popped
from ..model import Message
from ..plugins.spec import Durability
from ..protocol.codec import FieldTable
from ..protocol.errors import AMQPError, ReplyCode
from .arguments import QueueArguments
from .consumer import Consumer, DeliveryChannel
from .consumer_roster import ConsumerRoster
from .deadletter import Reason
from .flusher import Flusher
from .stats import MessageStats
from .supervisor import Spawn

if TYPE_CHECKING:
    from .exchange import BindingRef

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """``x-max-length(-bytes)`` reached with ``x-overflow`` reject-publish(-dlx): the publish is
    refused (nacked)."""


class QueueHost(Protocol):
    """What a queue needs of the vhost that holds it."""

    def dead_letter(self, queue: Queue, message: Message, reason: Reason) -> None:
        """Route a message the queue removed (``reason``) to its dead-letter exchange."""
        ...

    def queue_unused(self, queue: Queue) -> None:
        """Delete the queue: auto-delete after its last consumer left, or ``x-expires``."""
        ...


class Queue(abc.ABC):
    """What every kind of queue has, as the vhost and the channels see it: identity and
    lifetime (exclusive, auto-delete), bindings, consumers in priority order, the actor's
    wake-up. What messages do is the kind's: ``ClassicQueue`` in ``broker/classic.py``,
    ``StreamQueue`` in ``broker/streams/queue.py``."""

    def __init__(
        self,
        vhost: str,
        name: str,
        *,
        host: QueueHost,
        backend_name: str,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: QueueArguments,
        flusher: Flusher | None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.host = host
        self.backend_name = backend_name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        # Set for queues on a durable backend: persistent messages wait for its flushes.
        self.flusher = flusher
        self.consumers = ConsumerRoster()
        self.bound_by: set[BindingRef] = set()
        self.deleted = False
        # Why the queue failed (its actor or its store raised); None while it works.
        self.failure: str | None = None
        self.consumer_timeout_ms: int | None = None  # x-consumer-timeout, where the kind has it
        # Message counters and rates for the management API and metrics (``broker/stats.py``).
        self.stats = MessageStats()
        self._had_consumer = False
        self._last_used = trio.current_time()
        self._wakeup = trio.Event()
        # The actor's, while it runs (``stop`` cancels it); set once ``stop`` was called.
        self._cancel_scope: trio.CancelScope | None = None
        self._stopped = False
        # Starts the actor at the first wake-up, for a kind that starts it late (``begin``).
        self._start: Spawn | None = None

    # -- what each kind defines ----------------------------------------------------------------

    @abc.abstractmethod
    async def run(self) -> None:
        """The actor: deliver until the queue is deleted."""

    def begin(self, spawn: Spawn) -> None:
        """Start the actor (``spawn``: in the broker's nursery); a kind whose actor has nothing
        to do yet may start it at its first wake-up instead."""
        spawn(self.run, on_failure=self.fail)

    @abc.abstractmethod
    def publish(self, message: Message) -> Durability:
        """Take a routed message; return what its confirm waits for."""

    def publish_run(self, messages: Sequence[Message]) -> tuple[list[Durability], Exception | None]:
        """``publish`` each of ``messages``, in order, up to the first that raises: what the
        confirm of each one taken waits for, and what the one after them raised (None: all
        were taken). A kind that can take a run at once overrides it."""
        durabilities: list[Durability] = []
        publish, taken = self.publish, durabilities.append
        for message in messages:
            try:
                taken(publish(message))
            except Exception as exc:  # the caller refuses this one, as for ``publish``
                return durabilities, exc
        return durabilities, None

    @abc.abstractmethod
    def get(self) -> Popped | FlushFirst | None:
        """``basic.get``: the next message as ``(id, message, redelivered)``."""

    @abc.abstractmethod
    def ack(self, message_id: int, consumer: Consumer | None) -> None: ...

    def ack_many(self, message_ids: list[int], consumer: Consumer | None) -> None:
        """``ack`` of each of ``message_ids``, in order, all delivered to ``consumer`` (a
        ``multiple`` ack): a queue may settle them at once."""
        for message_id in message_ids:
            self.ack(message_id, consumer)

    @abc.abstractmethod
    def reject(self, message_id: int, consumer: Consumer | None) -> None: ...

    @abc.abstractmethod
    def requeue(self, message_id: int, consumer: Consumer | None) -> None: ...

    @abc.abstractmethod
    def purge(self) -> int: ...

    @property
    @abc.abstractmethod
    def message_count(self) -> int: ...

    def check_consumer(
        self, tag: str, *, no_ack: bool, prefetch_count: int, arguments: FieldTable
    ) -> None:
        """Refuse (``AMQPError``) a ``basic.consume`` this kind of queue does not allow (``tag``
        is the consumer tag the client chose, empty if it let the broker choose). Every consumer
        is allowed unless a kind says otherwise."""
        return None

    # -- lifetime ------------------------------------------------------------------------------

    @property
    def queue_type(self) -> str:
        """RabbitMQ's queue type: ``classic``, ``quorum`` (stored as a durable classic queue)
        or ``stream``; what the management API reports as ``type``."""
        return self.arguments.kind

    def touch(self) -> None:
        """The queue was used (basic.get, redeclare, a consumer came or went): restart the
        ``x-expires`` countdown."""
        self._last_used = trio.current_time()
        self.wake()

    def wake(self) -> None:
        """Let the actor run (started now if it starts late, ``begin``)."""
        self._wakeup.set()
        if self._start is not None:
            start, self._start = self._start, None
            start(self.run, on_failure=self.fail)

    def channel_ready(self, channel: DeliveryChannel) -> None:
        """``channel`` may take deliveries again (its socket drained, its shared prefetch freed,
        its ``basic.qos`` changed): deliver to its consumers again."""
        self.wake()

    def stop(self) -> None:
        """End the actor (one not started yet never starts)."""
        self._stopped = True
        self._start = None
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    @property
    def dead_letters_on_publish(self) -> bool:
        """Whether taking a message may dead-letter one at once (into any queue): a run routed
        to it and other queues then goes one message at a time to all of them
        (``Routing.enqueue_run``). A kind that never does says so."""
        return True

    @property
    def accepting(self) -> bool:
        """False while the queue's durable backend cannot write, or once the queue failed
        (publishes are refused: nacked)."""
        return self.failure is None and (self.flusher is None or self.flusher.healthy)

    def fail(self, error: BaseException) -> None:
        """A bug in the queue's actor or store: stop delivering, cancel the consumers
        (``basic.cancel``) and refuse publishes (nack), consumes and gets (541) until the queue
        is deleted. The rest of the broker goes on."""
        if self.failure is not None:
            return
        self.failure = f"{type(error).__name__}: {error}"
        log.error("queue '%s' in vhost '%s' failed: %s", self.name, self.vhost, self.failure)
        self.stop()
        self.cancel_consumers()

    def check_usable(self) -> None:
        """541 for a ``basic.consume`` or ``basic.get`` on a failed queue."""
        if self.failure is not None:
            raise AMQPError(
                ReplyCode.INTERNAL_ERROR,
                f"queue '{self.name}' in vhost '{self.vhost}' failed ({self.failure}); "
                "delete it to recover",
                hard=False,
            )

    # -- consumers ---------------------------------------------------------------------------

    @property
    def has_exclusive_consumer(self) -> bool:
        # An exclusive consumer is its queue's only consumer (checked in constant time: a queue
        # may have 100k consumers).
        consumers = self.consumers
        if len(consumers) != 1:
            return False
        first = consumers.first()
        return first is not None and first.exclusive

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.add(consumer)
        self.touch()  # also wakes the actor (if it has something to do: ``ClassicQueue``)
        self._had_consumer = True

    def remove_consumer(self, consumer: Consumer) -> None:
        self.remove_consumers((consumer,))

    def remove_consumers(self, gone: Collection[Consumer]) -> None:
        """Drop consumers (cancelled, or their channel closed), each in constant time: a
        channel with 100k consumers closes in milliseconds (``ConsumerRoster.remove_all``)."""
        if not self.consumers.remove_all(gone):
            return
        self.touch()  # also wakes the actor: e.g. the next single active consumer takes over
        if not self.consumers and self.auto_delete and self._had_consumer:
            self.host.queue_unused(self)

    def cancel_consumers(self) -> None:
        """The queue is deleted or failed: drop its consumers and tell their channels
        (``basic.cancel``)."""
        for consumer in self.consumers.clear():
            consumer.channel.consumer_cancelled(consumer)

    def __repr__(self) -> str:
        return f"Queue({self.vhost!r}, {self.name!r})"
