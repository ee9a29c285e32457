"""RabbitMQ's permission checks on a channel's operations, with its refusals' texts.

Responsibilities:
- ``ChannelAccess``: one channel's checks through its ``PermissionCache`` -- a synchronous
  answer when every check is cached (a dict lookup: the publish path), else an awaitable the
  connection's reader awaits before the next frame; a refusal is ``AMQPError`` 403 with
  RabbitMQ 3.10's text (``access to queue 'q' in vhost '/' refused for user 'u'``);
- what each method needs (``needs``), in RabbitMQ's order (``rabbit_channel``): declare and
  delete need ``configure`` (a new exchange's alternate exchange and a new queue's
  dead-letter exchange: ``read`` on it, ``write`` on the other); queue.bind/unbind ``write``
  on the queue, ``read`` on the exchange (exchange.bind: on the destination and the source),
  and on a topic exchange the topic permission ``read`` of the routing key; purge, get and
  consume ``read`` on the queue. Passive declares, the direct reply-to pseudo-queue and the
  names RabbitMQ refuses before looking at permissions (``amq.*`` queue names, the default
  exchange) need nothing here: their handler answers as before. ``basic.publish``'s checks
  (``write`` on the exchange, the topic permission ``write``) are ``Channel.publish``'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from ..auth import (
    AuthBackend,
    AuthChain,
    AuthUser,
    PermissionCache,
    PermissionKind,
    ResourceKind,
)
from ..auth.backends import DEFAULT_EXCHANGE_RESOURCE
from ..broker.declaring import server_name
from ..broker.reply_to import REPLY_TO
from ..protocol import methods as m
from ..protocol.errors import AMQPError, ReplyCode

if TYPE_CHECKING:
    from ..broker.vhost import VirtualHost
    from .topology import Topology

TOPIC = "topic"  # the exchange type whose routing keys topic permissions guard
WRITABLE_SIZE = 64  # exchanges a channel remembers it may publish to

# (kind, name, permission, routing key): a topic permission check has a routing key (kind is
# "topic", name the exchange), a resource check None.
Check = tuple[ResourceKind, str, PermissionKind, str | None]


def resource_refusal(kind: str, name: str, vhost: str, user: str) -> str:
    """RabbitMQ's text: ``access to exchange 'x' in vhost '/' refused for user 'bob'``."""
    if kind == "exchange" and name == "":
        name = DEFAULT_EXCHANGE_RESOURCE
    return f"access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


def topic_refusal(exchange: str, routing_key: str, vhost: str, user: str) -> str:
    """RabbitMQ's text for a refused topic permission."""
    return (
        f"access to topic '{routing_key}' in exchange '{exchange}' in vhost '{vhost}' "
        f"refused for user '{user}'"
    )


class ChannelAccess:
    """One channel's permission checks (its user, vhost and cache of answers)."""

    __slots__ = (
        "_generation",
        "_source",
        "_topic_writable",
        "_writable",
        "cache",
        "user",
        "vhost",
    )

    @classmethod
    def of_connection(cls, chain: AuthChain, user: AuthUser | None, vhost: str) -> ChannelAccess:
        """The checks of a channel of an open connection (authenticated: ``user`` is set).
        Topic permission patterns get ``{username}`` and ``{vhost}`` expanded; RabbitMQ 3.10
        takes no ``client_id`` from an AMQP 0-9-1 client's properties (the oracle leaves
        ``{client_id}`` as it is written), nor does this."""
        assert user is not None  # channels open after connection.open
        return cls(chain, user, vhost)

    def __init__(
        self,
        chain: AuthChain,
        user: AuthUser,
        vhost: str,
        variables: dict[str, str] | None = None,
    ) -> None:
        self.user, self.vhost = user, vhost
        self.cache = PermissionCache(chain, user, vhost, variables=variables)
        # The publish fast path: exchange -> may write, valid while the generation of the
        # answering backend (the chain's one backend, usually: one property read) is unchanged.
        backends = list(chain.backends.values())
        self._source: AuthChain | AuthBackend = backends[0] if len(backends) == 1 else chain
        self._generation = self._source.generation
        self._writable: dict[str, bool] = {}
        self._topic_writable: dict[tuple[str, str], bool] = {}

    def refusal(self, check: Check) -> AMQPError:
        kind, name, _permission, routing_key = check
        if routing_key is None:
            text = resource_refusal(kind, name, self.vhost, self.user.name)
        else:
            text = topic_refusal(name, routing_key, self.vhost, self.user.name)
        return AMQPError(ReplyCode.ACCESS_REFUSED, text)

    def cached(self, check: Check) -> bool | None:
        kind, name, permission, routing_key = check
        if routing_key is None:
            return self.cache.cached(kind, name, permission)
        return self.cache.cached_topic(name, routing_key, permission)

    async def ask(self, check: Check) -> bool:
        kind, name, permission, routing_key = check
        if routing_key is None:
            return await self.cache.check(kind, name, permission)
        return await self.cache.check_topic(name, routing_key, permission)

    def require(self, checks: Sequence[Check]) -> Awaitable[None] | None:
        """None if every check is cached and allowed; raises the first refusal's
        ``AMQPError``; else what to await (it raises the first refusal)."""
        for i, check in enumerate(checks):
            answer = self.cached(check)
            if answer is None:
                return self.check(checks[i:])
            if not answer:
                raise self.refusal(check)
        return None

    async def check(self, checks: Sequence[Check]) -> None:
        """Ask each check (through the cache); raises the first refusal's ``AMQPError``."""
        for check in checks:
            if not await self.ask(check):
                raise self.refusal(check)

    def writes(self, exchange: str) -> bool | None:
        """The publish fast path: the cached answer of ``write`` on ``exchange`` (None: ask
        ``check_write``)."""
        if self._source.generation != self._generation:
            return None
        return self._writable.get(exchange)

    def topic_writes(self, exchange: str, routing_key: str) -> bool | None:
        """The publish fast path on a topic exchange: the cached answer of the topic
        permission ``write`` of ``routing_key`` (None: ask ``check_topic_write``)."""
        if self._source.generation != self._generation:
            return None
        return self._topic_writable.get((exchange, routing_key))

    async def check_write(self, exchange: str) -> None:
        """``write`` on ``exchange`` asked (through the cache); remembered for ``writes``."""
        generation = self._source.generation
        await self.check([("exchange", exchange, "write", None)])
        self._remember(generation, self._writable, exchange)

    async def check_topic_write(self, exchange: str, routing_key: str) -> None:
        generation = self._source.generation
        await self.check([("topic", exchange, "write", routing_key)])
        self._remember(generation, self._topic_writable, (exchange, routing_key))

    def _remember(self, generation: int, allowed: dict[Any, bool], key: object) -> None:
        """An allowed publish, answered at ``generation``."""
        if generation != self._generation:
            self._writable.clear()
            self._topic_writable.clear()
            self._generation = generation
        if len(allowed) >= WRITABLE_SIZE:
            allowed.pop(next(iter(allowed)))
        allowed[key] = True


# -- what each method needs ------------------------------------------------------------------


def _topic_read(vhost: VirtualHost, exchange: str, routing_key: str) -> list[Check]:
    found = vhost.exchanges.get(exchange)
    if found is not None and found.type_name == TOPIC:
        return [("topic", exchange, "read", routing_key)]
    return []


def exchange_declare(vhost: VirtualHost, method: m.ExchangeDeclare) -> list[Check]:
    name = method.exchange
    if method.passive or name == "" or method.type not in vhost.exchange_types:
        return []  # nothing to check, or refused before the permission (403, 503)
    checks: list[Check] = [("exchange", name, "configure", None)]
    alternate = method.arguments.get("alternate-exchange")
    if name not in vhost.exchanges and isinstance(alternate, str | bytes):
        if isinstance(alternate, bytes):
            alternate = alternate.decode("utf-8", "replace")
        checks += [("exchange", name, "read", None), ("exchange", alternate, "write", None)]
    return checks


def exchange_delete(vhost: VirtualHost, method: m.ExchangeDelete) -> list[Check]:
    name = method.exchange
    if name == "" or name.startswith("amq."):
        return []  # refused before the permission, as RabbitMQ does
    return [("exchange", name, "configure", None)]


def exchange_bind(vhost: VirtualHost, method: m.ExchangeBind | m.ExchangeUnbind) -> list[Check]:
    checks: list[Check] = [("exchange", method.destination, "write", None)]
    if "" in (method.destination, method.source):
        return checks  # the default exchange: 403 before the source is looked at
    checks.append(("exchange", method.source, "read", None))
    return checks + _topic_read(vhost, method.source, method.routing_key)


def queue_declare(topology: Topology, method: m.QueueDeclare) -> list[Check]:
    """The checks of a non-passive declare. RabbitMQ checks a server-named queue's generated
    name: the check is on an ``amq.gen-`` name of the same form (not the very name the queue
    then gets, which ``broker/declaring.py`` draws)."""
    name = method.queue
    if method.passive or name == REPLY_TO or name.startswith("amq."):
        return []  # passive: nothing; amq.*: refused before the permission (403)
    vhost = topology.vhost
    if name == "":
        name = server_name()
    checks: list[Check] = [("queue", name, "configure", None)]
    dlx = method.arguments.get("x-dead-letter-exchange")
    if name not in vhost.queues and isinstance(dlx, str | bytes):
        if isinstance(dlx, bytes):
            dlx = dlx.decode("utf-8", "replace")
        checks += [("queue", name, "read", None), ("exchange", dlx, "write", None)]
    return checks


def queue_delete(topology: Topology, method: m.QueueDelete) -> list[Check]:
    return [("queue", topology.queue_name(method.queue), "configure", None)]


def queue_read(topology: Topology, method: Any) -> list[Check]:
    """queue.purge, basic.get, basic.consume: ``read`` on the queue."""
    queue: str = method.queue
    if queue == REPLY_TO:
        return []
    return [("queue", topology.queue_name(queue), "read", None)]


def queue_bind(topology: Topology, method: m.QueueBind | m.QueueUnbind) -> list[Check]:
    checks: list[Check] = [("queue", topology.queue_name(method.queue), "write", None)]
    if method.exchange == "":
        return checks  # the default exchange: 403 before the exchange is looked at
    checks.append(("exchange", method.exchange, "read", None))
    routing_key = method.routing_key
    if isinstance(method, m.QueueBind) and not routing_key and not method.queue:
        routing_key = topology.last_queue
    return checks + _topic_read(topology.vhost, method.exchange, routing_key)
