"""What a topic operation needs of RabbitMQ's permissions, for the protocols that reach
streams as topics (the HTTP topic routes, the Kafka listener): the permissions an AMQP client
would need to do the same (``http/topic_access.py`` has the rules in words)."""

from __future__ import annotations

from ..auth import PermissionKind, ResourceKind
from ..broker.streams.service import StreamService, TopicError
from ..broker.vhost import VirtualHost

Need = tuple[ResourceKind, str, PermissionKind]


def produce(vhost: VirtualHost, topic: str) -> list[Need]:
    """``write`` on the exchange a produce publishes through."""
    if topic in vhost.exchanges:
        return [("exchange", topic, "write")]
    if topic in vhost.queues:
        return [("exchange", "", "write")]  # the default exchange, checked as amq.default
    return []


def read(vhost: VirtualHost, topic: str, partition: int | None = None) -> list[Need]:
    """``read`` on the stream queue of ``partition`` (of every partition if None)."""
    try:
        found = StreamService(vhost).queue_names(topic)
    except TopicError:
        return []  # the route answers (404)
    if partition is not None:
        found = found[partition : partition + 1] if partition >= 0 else []
    return [("queue", name, "read") for name in found]


def configure(vhost: VirtualHost, topic: str) -> list[Need]:
    """``configure`` on the topic's exchange (if it has one) and its partitions' queues: what
    deleting the topic or altering its configs needs."""
    needs: list[Need] = [("exchange", topic, "configure")] if topic in vhost.exchanges else []
    try:
        found = StreamService(vhost).queue_names(topic)
    except TopicError:
        return needs
    return needs + [("queue", name, "configure") for name in found]


def declare(topic: str, count: int) -> list[Need]:
    """What declaring a topic of ``count`` partitions needs, as the AMQP methods would."""
    if not 1 <= count <= 1000:  # a declaration's bounds (topics.declare)
        return []  # refused by the declaration itself (400)
    queues = [f"{topic}-{n}" for n in range(count)]
    return [
        ("exchange", topic, "configure"),
        *[("queue", name, "configure") for name in queues],
        *[("queue", name, "write") for name in queues],
        ("exchange", topic, "read"),
    ]
