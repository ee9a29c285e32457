"""A bug in a plugin, a store or a queue actor costs that channel, exchange or queue, never the
broker: each test injects a failure at one boundary while a canary client on another connection
keeps publishing and consuming without a gap.

Exchange types come from a third-party distribution installed for the test (as a plugin author
would ship one); failing stores and actors are the built-in memory backend with one method
patched to raise.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from tests.support.canary import Canary
from tests.support.plugin_dist import PluginDistribution
from tqbroker.backends.memory import MemoryBackend, MemoryQueueStore
from tqbroker.plugins.loader import distributions
from tqbroker.testing import RunningBroker, running_broker

FAULTY_PLUGIN = '''
import trio

class FaultyRouter:
    """Routes like direct, but raises on routing key "boom" and on binding key "boom"."""
    cacheable = False

    def __init__(self):
        self.bindings = {}

    def bind(self, destination, key, arguments):
        if key == "boom":
            raise RuntimeError("cannot bind boom")
        self.bindings.setdefault(key, set()).add(destination)

    def unbind(self, destination, key, arguments):
        self.bindings.get(key, set()).discard(destination)

    def route(self, routing_key, headers):
        if routing_key == "boom":
            raise KeyError(routing_key)
        return self.bindings.get(routing_key, ())


class FaultyExchange:
    def validate(self, arguments):
        if "x-crash" in arguments:
            raise RuntimeError("validate crashed")

    def create_router(self, arguments):
        return FaultyRouter()


class DoomedRouter(FaultyRouter):
    """A holding router whose background task fails once the exchange exists."""

    def open(self, context):
        self.context = context

        async def fail():
            await trio.sleep(0.05)
            raise ZeroDivisionError("the doomed task failed")

        context.spawn(fail)

    def delete(self):
        pass


class DoomedExchange(FaultyExchange):
    def create_router(self, arguments):
        return DoomedRouter()
'''


@pytest.fixture(scope="module")
def faulty_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Install the distribution ``faulty-exchange`` 1.0 (module + dist-info) on sys.path."""
    plugin = PluginDistribution(
        tmp_path_factory.mktemp("faulty"),
        name="faulty-exchange",
        version="1.0",
        module="faulty_exchange",
        source=FAULTY_PLUGIN,
        exchange_types={
            "x-faulty": "faulty_exchange:FaultyExchange",
            "x-doomed": "faulty_exchange:DoomedExchange",
        },
    )
    plugin.install()
    try:
        yield
    finally:
        plugin.uninstall()


@pytest.fixture(scope="module")
def broker(faulty_plugin: None) -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


@pytest.fixture(scope="module")
def canary(broker: RunningBroker) -> Iterator[Canary]:
    with Canary(broker.host, broker.port) as running:
        yield running


@pytest.fixture
def channel(broker: RunningBroker, canary: Canary) -> Iterator[pika.adapters.BlockingConnection]:
    canary.mark()
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()
    canary.check()


def test_a_router_that_raises_costs_the_channel(
    broker: RunningBroker, channel: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    channel.exchange_declare("faulty-route", "x-faulty")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "faulty-route", "fine")
    channel.confirm_delivery()
    channel.basic_publish("faulty-route", "fine", b"before")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.basic_publish("faulty-route", "boom", b"boom")
    assert raised.value.reply_code == 541
    text = raised.value.reply_text
    assert text.startswith("INTERNAL_ERROR - ")
    assert "'x-faulty'" in text
    assert "faulty-exchange 1.0" in text
    assert "route" in text
    assert "KeyError" in text
    # The connection, the exchange and the other channels go on.
    other = channel.connection.channel()
    other.confirm_delivery()
    other.basic_publish("faulty-route", "fine", b"after")
    got = [other.basic_get(queue, auto_ack=True)[2] for _ in range(2)]
    assert got == [b"before", b"after"]


def test_a_bind_that_raises_costs_the_channel(
    channel: pika.adapters.blocking_connection.BlockingChannel,
) -> None:
    channel.exchange_declare("faulty-bind", "x-faulty")
    queue = channel.queue_declare("", exclusive=True).method.queue
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_bind(queue, "faulty-bind", "boom")
    assert raised.value.reply_code == 541
    assert "'x-faulty'" in raised.value.reply_text
    assert "bind" in raised.value.reply_text
    assert "RuntimeError: cannot bind boom" in raised.value.reply_text
    other = channel.connection.channel()
    other.queue_bind(queue, "faulty-bind", "fine")  # the exchange still works


def test_a_validate_that_raises_something_else_than_valueerror_is_a_541(
    channel: pika.adapters.blocking_connection.BlockingChannel,
) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.exchange_declare("faulty-declare", "x-faulty", arguments={"x-crash": 1})
    assert raised.value.reply_code == 541
    assert "faulty-exchange 1.0" in raised.value.reply_text
    other = channel.connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
        other.exchange_declare("faulty-declare", passive=True)
    assert missing.value.reply_code == 404  # nothing half-declared is left


def test_a_plugin_task_that_raises_fails_its_exchange_only(
    broker: RunningBroker,
    channel: pika.adapters.blocking_connection.BlockingChannel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        channel.exchange_declare("doomed", "x-doomed")
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "doomed", "k")
        channel.connection.sleep(0.5)  # the task fails meanwhile
    assert any("ZeroDivisionError" in r.getMessage() or r.exc_info for r in caplog.records)
    channel.confirm_delivery()  # so that the publish waits for the broker's answer
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.basic_publish("doomed", "k", b"x")
    assert raised.value.reply_code == 541
    assert "doomed" in raised.value.reply_text
    # Deleting the failed exchange clears it; the name can be declared again.
    other = channel.connection.channel()
    other.exchange_delete("doomed")
    other.exchange_declare("doomed", "direct")


def test_a_store_that_raises_on_push_fails_that_queue_only(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_push = MemoryQueueStore.push

    def push(self: MemoryQueueStore, message: object, persistent: bool) -> int:
        if getattr(message, "body", None) == b"poison":
            raise RuntimeError("the store cannot take this")
        return real_push(self, message, persistent)  # type: ignore[arg-type]

    monkeypatch.setattr(MemoryQueueStore, "push", push)
    channel.queue_declare("bad-store", exclusive=True)
    channel.queue_declare("good-store", exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", "bad-store", b"fine")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "bad-store", b"poison")
    # Failed: even good messages are refused (nacked) until it is deleted.
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "bad-store", b"fine again")
    channel.basic_publish("", "good-store", b"fine")
    assert channel.basic_get("good-store", auto_ack=True)[2] == b"fine"
    channel.queue_delete("bad-store")
    channel.queue_declare("bad-store", exclusive=True)
    channel.basic_publish("", "bad-store", b"works again")


def test_a_backend_that_raises_on_open_costs_the_channel(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_open = MemoryBackend.open_queue

    def open_queue(self: MemoryBackend, vhost: str, queue: str) -> MemoryQueueStore:
        if queue == "cannot-open":
            raise RuntimeError("the backend broke")
        return real_open(self, vhost, queue)

    monkeypatch.setattr(MemoryBackend, "open_queue", open_queue)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("cannot-open", exclusive=True)
    assert raised.value.reply_code == 541
    text = raised.value.reply_text
    assert "storage backend 'memory' (from tqbroker " in text
    assert "open_queue for queue 'cannot-open'" in text
    assert "RuntimeError: the backend broke" in text
    other = channel.connection.channel()
    other.queue_declare("can-open", exclusive=True)  # the backend and the connection go on


def test_a_queue_actor_that_raises_cancels_its_consumers(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_pop = MemoryQueueStore.pop
    armed = threading.Event()

    def pop(self: MemoryQueueStore) -> object:
        entry = real_pop(self)
        if armed.is_set() and entry is not None and entry[1].body == b"crash":
            raise RuntimeError("the store lost its mind")
        return entry

    monkeypatch.setattr(MemoryQueueStore, "pop", pop)
    channel.queue_declare("crashing", exclusive=True)
    cancelled: list[str] = []
    channel.basic_consume("crashing", lambda *args: None, auto_ack=True)
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    armed.set()
    channel.basic_publish("", "crashing", b"crash")
    for _ in range(50):
        channel.connection.process_data_events(time_limit=0.1)
        if cancelled:
            break
    assert cancelled, "the failed queue's consumer got no basic.cancel"
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "crashing", b"after")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.basic_consume("crashing", lambda *args: None)
    assert raised.value.reply_code == 541
    assert "crashing" in raised.value.reply_text


def test_the_plugins_distribution_is_named(faulty_plugin: None) -> None:
    assert distributions("tqbroker.exchange_types")["x-faulty"] == "faulty-exchange 1.0"
