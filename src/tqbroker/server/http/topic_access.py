"""The permission checks of the topic routes (JSON and columnar, the Spark data source's):
RabbitMQ's read/write permissions on what an AMQP client would touch to do the same.

- producing writes through the topic's exchange (the topic's name), or the default exchange
  (``amq.default``) for a topic that is one stream queue: ``write`` on that exchange;
- reading records or offsets of a partition: ``read`` on its stream queue (every partition's
  for the offsets of all, and for resetting a consumer group's offsets);
- declaring or growing a partitioned topic: ``configure`` on its exchange and its partitions'
  queues, and what binding them needs (``write`` on each queue, ``read`` on the exchange);
  deleting one or altering its configs: ``configure`` on them.

Listing and describing topics and groups (metadata, as the management API's listings) need
only access to the vhost.

A refusal is 403 with RabbitMQ's text (``access to queue 't-0' in vhost '/' refused for
user 'bob'``). A topic that does not exist needs nothing here: its route answers 404 as
before. The user is the request's (its login is cached by the authenticator).
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request

from ...broker.vhost import VirtualHost
from ..access import resource_refusal
from ..topic_needs import Need, configure, declare, produce, read
from .auth import broker_of, user_of
from .errors import RequestError


async def check_produce(request: Request, vhost: VirtualHost) -> None:
    """A produce to the path's topic (403 if refused)."""
    await require(request, vhost, produce(vhost, request.path_params["topic"]))


async def check_read(request: Request, vhost: VirtualHost, partition: object = None) -> None:
    """A read of the path's topic, of one partition (a number, or its text) or of all."""
    if isinstance(partition, str):
        try:
            partition = int(partition)
        except ValueError:
            return  # the route refuses it (400)
    index = partition if isinstance(partition, int) else None
    await require(request, vhost, read(vhost, request.path_params["topic"], index))


async def check_declare(request: Request, vhost: VirtualHost, count: int) -> None:
    """The declaration of the path's topic with ``count`` partitions."""
    await require(request, vhost, declare(request.path_params["topic"], count))


async def check_configure(request: Request, vhost: VirtualHost) -> None:
    """Deleting the path's topic or altering its configs: ``configure`` on its exchange and
    partitions' queues."""
    await require(request, vhost, configure(vhost, request.path_params["topic"]))


async def check_grow(request: Request, vhost: VirtualHost, count: int) -> None:
    """Growing the path's topic to ``count`` partitions: what declaring it so needs."""
    await require(request, vhost, declare(request.path_params["topic"], count))


async def require(request: Request, vhost: VirtualHost, needs: Iterable[Need]) -> None:
    """403 unless the request's user has every permission of ``needs`` on ``vhost``."""
    user = await user_of(request)
    chain = broker_of(request).authenticator.chain
    for kind, name, permission in needs:
        if not await chain.check_resource(user, vhost.name, kind, name, permission):
            raise RequestError(403, resource_refusal(kind, name, vhost.name, user.name))
