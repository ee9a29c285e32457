"""The vhost's route memo: (exchange, routing key) -> destinations, for routers that opt in with
``cacheable = True``, forgotten whenever routing state changes.

Real-socket scenarios with pika check that a memoised route is never served stale (after bind,
unbind, queue and exchange deletes, exchange-to-exchange bindings, alternate exchanges, CC
headers); vhost-level ones check what is and is not memoised, and that the memo stays bounded."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Hashable, Iterable
from typing import Any

import pika
import pika.exceptions
import pytest
import trio
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.pikaqueue import drain
from tests.support.polling import eventually
from tests.support.vhosts import (
    declare_exchange,
    declare_owned_queue,
    declare_queue,
    memory_vhost,
)
from tqbroker.broker.definitions import restore
from tqbroker.broker.exchange import Exchange
from tqbroker.broker.routing import ROUTE_MEMO_SIZE
from tqbroker.broker.vhost import VirtualHost
from tqbroker.plugins.loader import load_exchange_types
from tqbroker.plugins.spec import ExchangeType, Router
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.methods import BasicProperties
from tqbroker.testing import RunningBroker

NO_PROPERTIES = BasicProperties()

# -- real sockets --------------------------------------------------------------------------------


@pytest.fixture
def ch(channel: BlockingChannel) -> BlockingChannel:
    """A pika channel in confirm mode: a mandatory publish nobody receives raises
    ``UnroutableError``, so every publish is routed before the next call returns."""
    channel.confirm_delivery()
    return channel


def queue(ch: BlockingChannel, name: str, **arguments: Any) -> str:
    return str(ch.queue_declare(name, arguments=arguments or None).method.queue)


def unroutable(ch: BlockingChannel, exchange: str, key: str, **properties: Any) -> bool:
    """Publish mandatory; whether it came back NO_ROUTE."""
    try:
        ch.basic_publish(exchange, key, b"?", pika.BasicProperties(**properties), mandatory=True)
    except pika.exceptions.UnroutableError:
        return True
    return False


def test_bind_and_unbind_are_seen_at_once(ch: BlockingChannel) -> None:
    ch.exchange_declare("x", "direct")
    q1, q2 = queue(ch, "q1"), queue(ch, "q2")
    assert unroutable(ch, "x", "k")  # memoised: nowhere
    ch.queue_bind(q1, "x", "k")
    ch.basic_publish("x", "k", b"1")
    ch.basic_publish("x", "k", b"2")  # memoised: q1
    ch.queue_bind(q2, "x", "k")
    ch.basic_publish("x", "k", b"3")
    ch.queue_unbind(q1, "x", "k")
    ch.basic_publish("x", "k", b"4")
    ch.queue_unbind(q2, "x", "k")
    assert unroutable(ch, "x", "k")
    assert drain(ch, q1) == [b"1", b"2", b"3"]
    assert drain(ch, q2) == [b"3", b"4"]


def test_topic_binding_added_under_a_memoised_key(ch: BlockingChannel) -> None:
    wide, narrow = queue(ch, "wide"), queue(ch, "narrow")
    ch.queue_bind(wide, "amq.topic", "a.#")
    ch.basic_publish("amq.topic", "a.b.c", b"1")
    ch.queue_bind(narrow, "amq.topic", "*.b.*")
    ch.basic_publish("amq.topic", "a.b.c", b"2")
    ch.queue_unbind(wide, "amq.topic", "a.#")
    ch.basic_publish("amq.topic", "a.b.c", b"3")
    assert drain(ch, wide) == [b"1", b"2"]
    assert drain(ch, narrow) == [b"2", b"3"]


def test_deleted_queue_is_not_routed_to_and_its_successor_is(ch: BlockingChannel) -> None:
    q = queue(ch, "q")
    ch.queue_bind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"old")  # memoised: the first q
    ch.queue_delete(q)
    assert unroutable(ch, "amq.direct", "k")
    queue(ch, "q")
    assert unroutable(ch, "amq.direct", "k")  # a new queue: not bound yet
    ch.queue_bind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"new")
    assert drain(ch, q) == [b"new"]


def test_exchange_deleted_and_redeclared_as_another_type(ch: BlockingChannel) -> None:
    q = queue(ch, "q")
    ch.exchange_declare("x", "fanout")
    ch.queue_bind(q, "x", "")
    ch.basic_publish("x", "a", b"fanned")  # memoised: q
    ch.exchange_delete("x")
    ch.exchange_declare("x", "direct")
    ch.queue_bind(q, "x", "b")
    assert unroutable(ch, "x", "a")
    ch.basic_publish("x", "b", b"direct")
    assert drain(ch, q) == [b"fanned", b"direct"]


def test_exchange_to_exchange_bindings(ch: BlockingChannel) -> None:
    ch.exchange_declare("src", "direct")
    ch.exchange_declare("dst", "fanout")
    q = queue(ch, "q")
    ch.queue_bind(q, "dst", "")
    assert unroutable(ch, "src", "k")
    ch.exchange_bind("dst", "src", "k")
    ch.basic_publish("src", "k", b"via dst")
    ch.exchange_unbind("dst", "src", "k")
    assert unroutable(ch, "src", "k")
    ch.exchange_bind("dst", "src", "k")
    ch.basic_publish("src", "k", b"again")
    ch.queue_unbind(q, "dst", "")  # a binding one hop away
    assert unroutable(ch, "src", "k")
    ch.queue_bind(q, "dst", "")
    ch.exchange_delete("dst")  # the destination exchange goes, and its binding with it
    assert unroutable(ch, "src", "k")
    assert drain(ch, q) == [b"via dst", b"again"]


def test_alternate_exchange_declared_and_deleted_later(ch: BlockingChannel) -> None:
    ch.exchange_declare("x", "direct", arguments={"alternate-exchange": "ae"})
    routed, caught = queue(ch, "routed"), queue(ch, "caught")
    assert unroutable(ch, "x", "k")  # memoised: nowhere (no "ae" yet)
    ch.exchange_declare("ae", "fanout")
    ch.queue_bind(caught, "ae", "")
    ch.basic_publish("x", "k", b"to the AE", mandatory=True)
    ch.queue_bind(routed, "x", "k")
    ch.basic_publish("x", "k", b"routed")
    ch.queue_unbind(routed, "x", "k")
    ch.exchange_delete("ae")
    assert unroutable(ch, "x", "k")
    assert drain(ch, routed) == [b"routed"]
    assert drain(ch, caught) == [b"to the AE"]


def test_cc_and_bcc_keys_route_as_a_union(ch: BlockingChannel) -> None:
    a, b, c = queue(ch, "a"), queue(ch, "b"), queue(ch, "c")
    ch.queue_bind(a, "amq.direct", "ka")
    ch.queue_bind(b, "amq.direct", "kb")
    ch.queue_bind(c, "amq.direct", "kc")
    ch.queue_bind(a, "amq.direct", "kc")  # a reached twice: delivered once
    cc = {"CC": ["kb", "kc"]}
    ch.basic_publish("amq.direct", "ka", b"1", pika.BasicProperties(headers=cc))
    ch.queue_unbind(b, "amq.direct", "kb")
    ch.basic_publish("amq.direct", "ka", b"2", pika.BasicProperties(headers=cc))
    ch.basic_publish("amq.direct", "kx", b"3", pika.BasicProperties(headers={"BCC": ["kc"]}))
    assert drain(ch, a) == [b"1", b"2", b"3"]
    assert drain(ch, b) == [b"1"]
    assert drain(ch, c) == [b"1", b"2", b"3"]


def test_exclusive_queue_gone_with_its_connection(
    ch: BlockingChannel, tqbroker_thread: RunningBroker
) -> None:
    other = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    try:
        other_ch = other.channel()
        mine = str(other_ch.queue_declare("mine", exclusive=True).method.queue)
        other_ch.queue_bind(mine, "amq.fanout", "")
        ch.basic_publish("amq.fanout", "k", b"x", mandatory=True)  # memoised: mine
    finally:
        other.close()
    eventually(
        lambda: unroutable(ch, "amq.fanout", "k"), 5, what="the exclusive queue's route gone"
    )


def test_expired_queue_is_not_routed_to(ch: BlockingChannel) -> None:
    q = queue(ch, "brief", **{"x-expires": 200})
    ch.queue_bind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"x", mandatory=True)  # memoised: brief
    eventually(lambda: unroutable(ch, "amq.direct", "k"), 5, what="the expired queue's route gone")
    queue(ch, "brief")
    ch.queue_bind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"y", mandatory=True)
    assert drain(ch, q) == [b"y"]


def test_headers_exchange_routes_each_message_on_its_headers(ch: BlockingChannel) -> None:
    ch.exchange_declare("h", "headers")
    q = queue(ch, "q")
    ch.queue_bind(q, "h", "", arguments={"x-match": "all", "kind": "a"})
    for kind in ("a", "b", "a"):  # one routing key, different headers
        ch.basic_publish("h", "", kind.encode(), pika.BasicProperties(headers={"kind": kind}))
    assert drain(ch, q) == [b"a", b"a"]


# -- the vhost -----------------------------------------------------------------------------------


class RoundRobinRouter:
    """A router whose result varies per call (and that does not say ``cacheable``)."""

    def __init__(self) -> None:
        self.destinations: list[Hashable] = []
        self.calls = 0

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        self.destinations.append(destination)

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        self.destinations.remove(destination)

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        self.calls += 1
        if not self.destinations:
            return ()
        return (self.destinations[self.calls % len(self.destinations)],)


class RoundRobinExchange:
    def validate(self, arguments: FieldTable) -> None:
        pass

    def create_router(self, arguments: FieldTable) -> Router:
        return RoundRobinRouter()


class BadlyOptedRouter(RoundRobinRouter):
    cacheable = "yes"  # not True: not an opt-in


class BadlyOptedExchange(RoundRobinExchange):
    def create_router(self, arguments: FieldTable) -> Router:
        return BadlyOptedRouter()


@pytest.fixture
async def vhost() -> AsyncIterator[VirtualHost]:
    types: dict[str, ExchangeType] = {
        "x-round-robin": RoundRobinExchange(),
        "x-badly-opted": BadlyOptedExchange(),
    }
    async with trio.open_nursery() as nursery:
        yield memory_vhost(nursery, types)
        nursery.cancel_scope.cancel()


def memo(vhost: VirtualHost) -> dict[tuple[Exchange, str], tuple[Any, ...]]:
    return vhost.routing.memo


def route(vhost: VirtualHost, exchange: str, *keys: str, **headers: Any) -> list[str]:
    properties = BasicProperties(headers=headers) if headers else NO_PROPERTIES
    found = vhost.route_keys(vhost.exchanges[exchange], keys, properties)
    return sorted(destination.name for destination in found)


async def test_memoised_route_is_a_shared_tuple(vhost: VirtualHost) -> None:
    q = declare_queue(vhost, "q")
    vhost.bind_queue("q", "amq.direct", "k", {}, None)
    direct = vhost.exchanges["amq.direct"]
    first = vhost.route_keys(direct, ["k"], NO_PROPERTIES)
    assert first == (q,)
    assert memo(vhost) == {(direct, "k"): (q,)}
    assert vhost.route_keys(direct, ["k"], NO_PROPERTIES) is first  # served from the memo
    assert vhost.route_keys(direct, ["nothing"], NO_PROPERTIES) == ()
    assert (direct, "nothing") in memo(vhost)  # "nowhere" is memoised too
    both = vhost.route_keys(direct, ["k", "k"], NO_PROPERTIES)  # CC: a fresh union
    assert isinstance(both, tuple)
    assert both == (q,)


OWNER = object()  # a connection

CHANGES: dict[str, Any] = {
    "declare queue": lambda v: declare_queue(v, "other"),
    "delete queue": lambda v: v.delete_queue("q", if_unused=False, if_empty=False, owner=None),
    "bind queue": lambda v: v.bind_queue("q", "amq.direct", "j", {}, None),
    "unbind queue": lambda v: v.unbind_queue("q", "amq.direct", "k", {}, None),
    "declare exchange": lambda v: declare_exchange(v, "x", "fanout"),
    "delete exchange": lambda v: v.delete_exchange("x0", if_unused=False),
    "bind exchange": lambda v: v.bind_exchange("x0", "amq.direct", "k", {}),
    "unbind exchange": lambda v: v.unbind_exchange("x0", "amq.topic", "t", {}),
    "restore": lambda v: restore(v, {}),
    "exclusive queue closed": lambda v: v.connection_closed(OWNER),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_routing_changes_forget_the_memo(vhost: VirtualHost, change: str) -> None:
    declare_queue(vhost, "q")
    declare_exchange(vhost, "x0", "fanout")
    vhost.bind_exchange("x0", "amq.topic", "t", {})
    declare_owned_queue(vhost, "mine", OWNER)
    vhost.bind_queue("mine", "amq.fanout", "", {}, OWNER)
    vhost.bind_queue("q", "amq.direct", "k", {}, None)
    route(vhost, "amq.direct", "k")
    route(vhost, "amq.fanout", "k")
    assert len(memo(vhost)) == 2
    done = CHANGES[change](vhost)
    if inspect.iscoroutine(done):
        await done
    assert not memo(vhost)


async def test_redundant_operations_keep_the_memo(vhost: VirtualHost) -> None:
    declare_queue(vhost, "q")
    declare_exchange(vhost, "x", "direct")
    vhost.bind_queue("q", "x", "k", {}, None)
    assert route(vhost, "x", "k") == ["q"]
    vhost.bind_queue("q", "x", "k", {}, None)  # exists already
    vhost.unbind_queue("q", "x", "nope", {}, None)  # no such binding
    declare_queue(vhost, "q")  # redeclared
    declare_exchange(vhost, "x", "direct")  # redeclared
    vhost.delete_exchange("missing", if_unused=False)
    assert len(memo(vhost)) == 1


async def test_alternate_default_exchange_sees_new_queues(vhost: VirtualHost) -> None:
    declare_exchange(vhost, "x", "direct", **{"alternate-exchange": ""})
    assert route(vhost, "x", "late") == []
    assert memo(vhost)  # direct, then the default exchange: both cacheable
    declare_queue(vhost, "late")
    assert route(vhost, "x", "late") == ["late"]


async def test_headers_exchange_is_not_memoised(vhost: VirtualHost) -> None:
    declare_queue(vhost, "q")
    vhost.bind_queue("q", "amq.match", "", {"x-match": "any", "kind": "a"}, None)
    assert route(vhost, "amq.match", "k", kind="a") == ["q"]
    assert route(vhost, "amq.match", "k", kind="b") == []
    assert route(vhost, "amq.match", "k", kind="a") == ["q"]
    assert not memo(vhost)


@pytest.mark.parametrize("kind", ["x-round-robin", "x-badly-opted"])
async def test_router_without_opt_in_is_asked_every_time(vhost: VirtualHost, kind: str) -> None:
    declare_exchange(vhost, "rr", kind)
    for name in ("q1", "q2"):
        declare_queue(vhost, name)
        vhost.bind_queue(name, "rr", "", {}, None)
    assert [route(vhost, "rr", "k") for _ in range(4)] == [["q2"], ["q1"], ["q2"], ["q1"]]
    assert not memo(vhost)


async def test_a_non_cacheable_exchange_on_the_path_prevents_memoising(
    vhost: VirtualHost,
) -> None:
    declare_exchange(vhost, "rr", "x-round-robin")
    for name in ("q1", "q2"):
        declare_queue(vhost, name)
        vhost.bind_queue(name, "rr", "", {}, None)
    vhost.bind_exchange("rr", "amq.direct", "k", {})
    assert [route(vhost, "amq.direct", "k") for _ in range(2)] == [["q2"], ["q1"]]
    assert not memo(vhost)
    # Not on the path (the key routes elsewhere): memoised.
    vhost.bind_queue("q1", "amq.direct", "j", {}, None)
    assert route(vhost, "amq.direct", "j") == ["q1"]
    assert list(memo(vhost)) == [(vhost.exchanges["amq.direct"], "j")]


async def test_plugin_routers(vhost: VirtualHost) -> None:
    if not {"x-consistent-hash", "x-key-partition", "x-delayed-message"} <= set(
        vhost.exchange_types
    ):
        pytest.skip("first-party plugins not installed")
    for name in ("q1", "q2", "q3"):
        declare_queue(vhost, name)
    on_key = declare_exchange(vhost, "chx", "x-consistent-hash")
    on_header = declare_exchange(vhost, "chx-h", "x-consistent-hash", **{"hash-header": "h"})
    on_property = declare_exchange(
        vhost, "chx-p", "x-consistent-hash", **{"hash-property": "message_id"}
    )
    partitioned = declare_exchange(vhost, "part", "x-key-partition")
    delayed = declare_exchange(vhost, "delay", "x-delayed-message", **{"x-delayed-type": "direct"})
    assert on_key.cacheable
    assert not on_header.cacheable
    assert not on_property.cacheable
    assert not partitioned.cacheable
    assert not delayed.cacheable
    for name in ("q1", "q2", "q3"):
        for exchange in ("chx", "chx-h", "chx-p"):
            vhost.bind_queue(name, exchange, "1", {}, None)
    for n, name in enumerate(("q1", "q2", "q3")):
        vhost.bind_queue(name, "part", str(n), {}, None)
    vhost.bind_queue("q1", "delay", "k", {}, None)

    spread = {route(vhost, "chx", f"key-{i}")[0] for i in range(50)}
    assert spread == {"q1", "q2", "q3"}
    assert len(memo(vhost)) == 50
    assert route(vhost, "chx", "key-7") == route(vhost, "chx", "key-7")
    memo(vhost).clear()
    spread = {route(vhost, "chx-h", "k", h=f"v{i}")[0] for i in range(50)}
    assert spread == {"q1", "q2", "q3"}
    route(vhost, "part", "k")
    route(vhost, "part", "")  # round-robin
    assert route(vhost, "delay", "k") == ["q1"]
    assert route(vhost, "delay", "k", **{"x-delay": 60_000}) == ["delay"]  # held
    assert not memo(vhost)


async def test_memo_stays_bounded(vhost: VirtualHost) -> None:
    declare_queue(vhost, "q")
    vhost.bind_queue("q", "amq.topic", "a.#", {}, None)
    for i in range(ROUTE_MEMO_SIZE + 100):
        assert route(vhost, "amq.topic", f"a.{i}") == ["q"]
        assert len(memo(vhost)) <= ROUTE_MEMO_SIZE
    assert route(vhost, "amq.topic", "b") == []


def test_builtin_routers_opt_in() -> None:
    types = load_exchange_types()
    opted = {
        name: getattr(types[name].create_router({}), "cacheable", False)
        for name in ("direct", "fanout", "topic", "headers")
    }
    assert opted == {"direct": True, "fanout": True, "topic": True, "headers": False}
