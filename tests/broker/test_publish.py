"""The broker's one publish (``Routing.publish``, ``publish_run``), without sockets: what every
publisher gets (CC/BCC, direct reply-to, alternate exchanges, holding destinations, the counters)
and what a broker republish (``stats=None``: dead-lettering, a held message) does not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterable
from typing import Any

import pytest
import trio

from tests.support.vhosts import declare_exchange, declare_queue, memory_vhost
from tqbroker.broker.queue import Queue
from tqbroker.broker.stats import MessageStats
from tqbroker.broker.vhost import VirtualHost
from tqbroker.model import Message
from tqbroker.plugins.spec import Router
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.methods import BasicProperties


class Holder:
    """A destination of an exchange type's own, as a holding exchange's router returns."""

    name = "holder"
    accepting = True

    def __init__(self) -> None:
        self.taken: list[Message] = []

    def publish(self, message: Message) -> None:
        self.taken.append(message)


class HoldingRouter:
    def __init__(self) -> None:
        self.holder = Holder()

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        pass

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        pass

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        return (self.holder,)


class HoldingType:
    def validate(self, arguments: FieldTable) -> None:
        pass

    def create_router(self, arguments: FieldTable) -> Router:
        return HoldingRouter()


@pytest.fixture
async def vhost() -> AsyncIterator[VirtualHost]:
    async with trio.open_nursery() as nursery:
        yield memory_vhost(nursery, {"x-holds": HoldingType()})
        nursery.cancel_scope.cancel()


def message(exchange: str, key: str, **properties: Any) -> Message:
    props = BasicProperties(**properties)
    return Message(exchange, key, props.encode(), b"body", props, 0)


def taken(queue: Queue) -> list[Message]:
    found = []
    while isinstance(entry := queue.get(), tuple):
        found.append(entry[1])
    return found


async def test_cc_and_bcc_route_and_bcc_is_not_delivered(vhost: VirtualHost) -> None:
    for name in ("a", "b", "c"):
        declare_queue(vhost, name)
        vhost.bind_queue(name, "amq.direct", name, {}, None)
    direct, stats = vhost.exchanges["amq.direct"], MessageStats()
    sent = message("amq.direct", "a", headers={"CC": ["b"], "BCC": ["c"], "x": 1})
    waits, refused, returned, destinations = vhost.routing.publish(direct, sent, True, stats)
    assert (waits, refused, returned) == ([], False, None)
    assert sorted(d.name for d in destinations) == ["a", "b", "c"]
    for name in ("a", "b", "c"):
        (got,) = taken(vhost.queues[name])
        assert got.properties.headers == {"CC": ["b"], "x": 1}
    assert (direct.stats.publish_in, direct.stats.publish_out) == (1, 3)


async def test_without_sender_selected_distribution_cc_and_bcc_are_plain_headers(
    vhost: VirtualHost,
) -> None:
    for name in ("a", "b"):
        declare_queue(vhost, name)
        vhost.bind_queue(name, "amq.direct", name, {}, None)
    direct = vhost.exchanges["amq.direct"]
    sent = message("amq.direct", "a", headers={"CC": ["b"], "BCC": ["b"]})
    destinations = vhost.routing.publish(direct, sent, sender_selected=False)[3]
    assert [d.name for d in destinations] == ["a"]
    assert [m.properties.headers for m in taken(vhost.queues["a"])] == [sent.properties.headers]


async def test_unroutable_is_returned_when_mandatory_else_dropped(vhost: VirtualHost) -> None:
    direct, stats = vhost.exchanges["amq.direct"], MessageStats()
    sent = message("amq.direct", "nowhere")
    assert vhost.routing.publish(direct, sent, True, stats)[2] is sent
    assert vhost.routing.publish(direct, sent, False, stats)[2] is None
    assert (stats.return_unroutable, stats.drop_unroutable) == (1, 1)
    assert (direct.stats.publish_in, direct.stats.publish_out) == (2, 0)


async def test_alternate_exchange_takes_what_the_exchange_does_not_route(
    vhost: VirtualHost,
) -> None:
    declare_queue(vhost, "ae-q")
    declare_exchange(vhost, "ae", "fanout")
    vhost.bind_queue("ae-q", "ae", "", {}, None)
    main = declare_exchange(vhost, "main", "direct", **{"alternate-exchange": "ae"})
    _waits, _refused, returned, destinations = vhost.routing.publish(
        main, message("main", "k"), mandatory=True, stats=MessageStats()
    )
    assert returned is None
    assert [d.name for d in destinations] == ["ae-q"]


async def test_a_mandatory_message_reaching_only_a_holding_destination_is_returned(
    vhost: VirtualHost,
) -> None:
    holding, stats = declare_exchange(vhost, "held", "x-holds"), MessageStats()
    sent = message("held", "k")
    _waits, _refused, returned, _destinations = vhost.routing.publish(holding, sent, True, stats)
    assert returned is sent
    router = holding.router
    assert isinstance(router, HoldingRouter)
    assert router.holder.taken == [sent]  # held all the same, as RabbitMQ's delayed exchange
    assert vhost.routing.publish(holding, sent, False, stats)[2] is None


class ReplyConsumer:
    def __init__(self) -> None:
        self.replies: list[Message] = []

    def deliver_reply(self, message: Message) -> None:
        self.replies.append(message)


async def test_a_client_reply_reaches_a_direct_reply_to_address(vhost: VirtualHost) -> None:
    consumer, stats = ReplyConsumer(), MessageStats()
    address = vhost.register_reply_consumer(consumer)
    default = vhost.default_exchange
    reply = message("", address)
    assert vhost.routing.publish(default, reply, True, stats) == ([], False, None, ())
    assert consumer.replies == [reply]
    assert (default.stats.publish_in, default.stats.publish_out) == (1, 1)
    vhost.unregister_reply_consumer(address)
    assert vhost.routing.publish(default, reply, True, stats)[2] is reply
    assert stats.return_unroutable == 1


async def test_a_broker_republish_is_not_counted_and_reaches_no_reply_address(
    vhost: VirtualHost,
) -> None:
    consumer = ReplyConsumer()
    address = vhost.register_reply_consumer(consumer)
    declare_queue(vhost, "q")
    default = vhost.default_exchange
    vhost.routing.publish(default, message("", address))
    vhost.routing.publish(default, message("", "q"))
    assert consumer.replies == []
    assert len(taken(vhost.queues["q"])) == 1
    assert (default.stats.publish_in, default.stats.publish_out) == (0, 0)


async def test_to_chooses_among_the_routed_destinations(vhost: VirtualHost) -> None:
    for name in ("a", "b"):
        declare_queue(vhost, name)
        vhost.bind_queue(name, "amq.fanout", "", {}, None)
    fanout, stats = vhost.exchanges["amq.fanout"], MessageStats()
    only_b = vhost.queues["b"]
    _waits, _refused, returned, destinations = vhost.routing.publish(
        fanout, message("amq.fanout", ""), True, stats, to=lambda d: d is only_b
    )
    assert (returned, list(destinations)) == (None, [only_b])
    assert (len(taken(vhost.queues["a"])), len(taken(only_b))) == (0, 1)
    assert fanout.stats.publish_out == 1


async def test_a_run_is_published_and_counted_as_its_messages_one_by_one(
    vhost: VirtualHost,
) -> None:
    declare_queue(vhost, "q")
    vhost.bind_queue("q", "amq.direct", "k", {}, None)
    direct, stats = vhost.exchanges["amq.direct"], MessageStats()
    returns: list[Message] = []
    run = [message("amq.direct", "k") for _ in range(5)]
    confirms = vhost.routing.publish_run(direct, run, True, stats, returns.append)
    assert sum(count for count, _waits, _refused in confirms) == 5
    assert not any(refused for _count, _waits, refused in confirms)
    assert len(taken(vhost.queues["q"])) == 5
    assert (direct.stats.publish_in, direct.stats.publish_out) == (5, 5)
    unroutable = [message("amq.direct", "none") for _ in range(3)]
    vhost.routing.publish_run(direct, unroutable, True, stats, returns.append)
    assert returns == unroutable
    assert stats.return_unroutable == 3
