"""The ``x-delayed-message`` exchange type (plugins/delayed_message), over real sockets.

Time-driven scenarios run the broker in-process (``tqbroker.testing.start_broker``) under Trio's
``MockClock`` and talk to it with aio-pika through trio-asyncio, so minutes of delays pass in
milliseconds and arrival times are exact. A few end-to-end tests use pika and the real clock with
short delays: declare errors, publisher confirms that wait for the fsync, and a ``kill -9``.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aio_pika
import pika
import pytest
import trio
import trio.testing
import trio_asyncio
from aio_pika.abc import AbstractIncomingMessage
from tqbroker_delayed_message import DelayedMessageExchange, parse_delay

from tqbroker.backends.log import segment as segment_module
from tqbroker.config import BrokerConfig
from tqbroker.plugins.loader import load_exchange_types
from tqbroker.testing import (
    DURABLE_BACKEND_ENV,
    durable_backend_for_tests,
    running_broker,
    start_broker,
    start_broker_process,
)

T = TypeVar("T")
DELAYED = "x-delayed-message"
# Arrivals are exact in mock time up to the broker's work for them, which takes no mock time
# unless the clock jumps: allow a little. Due times are whole milliseconds (tqbroker.clock.now_ms
# truncates), so a message may also come out up to 1 ms before publish time + delay.
SLACK = 0.05
EARLY = 0.001


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    """Jumps to the next deadline once everything has been idle for 20 ms of real time (not at
    once: the loopback bytes between client and broker must have arrived, and the broker's work
    in worker threads — flushes, recovery — must have finished: on a loaded machine a flush
    takes more than a few milliseconds, and a jump over it made a consumer's collection window
    end before a due message had been delivered)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


@asynccontextmanager
async def in_process_broker(data_dir: Path, backend: str | None = None) -> AsyncIterator[str]:
    """A broker in this Trio run; yields its URL. Leaving cancels it (its backends close)."""
    config = BrokerConfig(
        port=0, data_dir=data_dir, durable_backend=backend or durable_backend_for_tests()
    )
    async with trio.open_nursery() as nursery:
        broker = await start_broker(nursery, config)
        yield broker.url
        nursery.cancel_scope.cancel()


async def aio(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run asyncio code (aio-pika) from the Trio test."""
    async with trio_asyncio.open_loop():
        return await trio_asyncio.aio_as_trio(fn)(*args)


def now() -> float:
    return asyncio.get_running_loop().time()  # trio-asyncio: Trio's (mock) clock


class Recorder:
    """Consumes a queue, recording (body, arrival time, headers)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, float, dict[str, Any]]] = []

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        self.got.append((message.body.decode(), now(), dict(message.headers)))

    @property
    def bodies(self) -> list[str]:
        return [body for body, _at, _headers in self.got]


async def publish(
    exchange: aio_pika.abc.AbstractExchange,
    routing_key: str,
    body: str,
    *,
    delay: object = None,
    persistent: bool = False,
    mandatory: bool = False,
) -> None:
    headers: dict[str, Any] = {} if delay is None else {"x-delay": delay}
    mode = aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
    await exchange.publish(
        aio_pika.Message(body.encode(), headers=headers, delivery_mode=mode),
        routing_key,
        mandatory=mandatory,
    )


@asynccontextmanager
async def channel(url: str) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(url)
    async with connection:
        yield await connection.channel()


async def setup(
    ch: aio_pika.abc.AbstractChannel,
    delayed_type: str = "direct",
    bindings: tuple[str, ...] = ("k",),
    *,
    durable: bool = False,
    name: str = "delayed",
    queue: str = "",
) -> tuple[aio_pika.abc.AbstractExchange, aio_pika.abc.AbstractQueue]:
    exchange = await ch.declare_exchange(
        name, DELAYED, durable=durable, arguments={"x-delayed-type": delayed_type}
    )
    q = await ch.declare_queue(queue, durable=durable, exclusive=not queue)
    for key in bindings:
        await q.bind(exchange, key)
    return exchange, q


# -- scenarios under MockClock -----------------------------------------------------------------


async def test_delayed_job_is_held_until_due(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async def scenario(url: str) -> None:
        async with channel(url) as ch:
            exchange, q = await setup(ch)
            recorder = Recorder()
            await q.consume(recorder.on_message, no_ack=True)
            start = now()
            await publish(exchange, "k", "job", delay=60_000)
            await publish(exchange, "k", "now")
            await asyncio.sleep(59.9)
            assert recorder.bodies == ["now"]  # not a moment early
            assert recorder.got[0][1] - start < SLACK
            await asyncio.sleep(0.2)
            assert recorder.bodies == ["now", "job"]
            _body, at, headers = recorder.got[1]
            assert 60 - EARLY <= at - start < 60 + SLACK
            assert headers["x-delay"] == -60_000  # as RabbitMQ's plugin delivers it

    async with in_process_broker(tmp_path) as url:
        await aio(scenario, url)


async def test_order_follows_due_time_not_publish_order(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    delays = [5000, 1000, 3000, 2000, 1000, 4000]  # RabbitMQ's plugin test uses these

    async def scenario(url: str) -> None:
        async with channel(url) as ch:
            exchange, q = await setup(ch)
            recorder = Recorder()
            await q.consume(recorder.on_message, no_ack=True)
            start = now()
            for i, delay in enumerate(delays):
                await publish(exchange, "k", f"{i}:{delay}", delay=delay)
            await asyncio.sleep(6)
            expected = sorted(enumerate(delays), key=lambda item: (item[1], item[0]))
            assert recorder.bodies == [f"{i}:{d}" for i, d in expected]  # ties: publish order
            for body, at, _headers in recorder.got:
                due = int(body.split(":")[1]) / 1000
                assert due - EARLY <= at - start < due + SLACK

    async with in_process_broker(tmp_path) as url:
        await aio(scenario, url)


async def test_topic_routing_happens_when_due(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async def scenario(url: str) -> None:
        async with channel(url) as ch:
            exchange, star = await setup(ch, "topic", ("a.*.c",))
            hash_q = await ch.declare_queue("", exclusive=True)
            await hash_q.bind(exchange, "a.#")
            star_rec, hash_rec = Recorder(), Recorder()
            await star.consume(star_rec.on_message, no_ack=True)
            await hash_q.consume(hash_rec.on_message, no_ack=True)
            for key in ("a.b.c", "a.z.c", "a.j.k", "b.b.c"):
                await publish(exchange, key, key, delay=1000)
            await asyncio.sleep(0.9)
            assert star_rec.got == hash_rec.got == []
            await asyncio.sleep(0.2)
            assert star_rec.bodies == ["a.b.c", "a.z.c"]
            assert hash_rec.bodies == ["a.b.c", "a.z.c", "a.j.k"]

    async with in_process_broker(tmp_path) as url:
        await aio(scenario, url)


async def test_x_delay_values_as_rabbitmq_reads_them(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Integers are the delay; floats are truncated; integer strings are parsed (STOMP);
    absent, zero, negative or anything else routes at once, the header untouched."""
    immediate: list[object] = [None, 0, -5, "abc", "1.5", True, 0.5, [1000]]
    delayed: list[tuple[object, float]] = [("2000", 2.0), (1500.9, 1.5), (1, 0.001)]

    async def scenario(url: str) -> None:
        async with channel(url) as ch:
            exchange, q = await setup(ch)
            recorder = Recorder()
            await q.consume(recorder.on_message, no_ack=True)
            start = now()
            for i, value in enumerate(immediate):
                await publish(exchange, "k", f"now{i}", delay=value)
            for i, (value, _due) in enumerate(delayed):
                await publish(exchange, "k", f"later{i}", delay=value)
            await asyncio.sleep(3)
            assert recorder.bodies[: len(immediate)] == [f"now{i}" for i in range(len(immediate))]
            for (_body, at, headers), value in zip(recorder.got, immediate, strict=False):
                assert at - start < SLACK
                if value is not None:
                    assert headers["x-delay"] == value
            later = {body: (at, headers) for body, at, headers in recorder.got[len(immediate) :]}
            assert len(later) == len(delayed)
            for i, (_value, due) in enumerate(delayed):
                at, headers = later[f"later{i}"]
                assert due - EARLY <= at - start < due + SLACK
                assert headers["x-delay"] == -round(due * 1000)

    async with in_process_broker(tmp_path) as url:
        await aio(scenario, url)


async def test_routing_uses_the_bindings_of_delivery_time(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async def scenario(url: str) -> None:
        async with channel(url) as ch:
            exchange, q = await setup(ch, bindings=("gone",))
            recorder = Recorder()
            await q.consume(recorder.on_message, no_ack=True)
            await publish(exchange, "late", "bound later", delay=5000)
            await publish(exchange, "gone", "unbound before due", delay=5000)
            await asyncio.sleep(2)
            await q.bind(exchange, "late")
            await q.unbind(exchange, "gone")
            await asyncio.sleep(3.1)
            assert recorder.bodies == ["bound later"]

    async with in_process_broker(tmp_path) as url:
        await aio(scenario, url)


async def test_exchange_to_exchange_and_alternate_exchange_at_delivery_time(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Bound to another exchange, a delayed exchange routes there when the message is due; its
    alternate exchange gets what no binding takes then, not at publish time (RabbitMQ's plugin
    also hands it over at publish time: its issue #36)."""

    async def scenario(url: str) -> None:
        async with channel(url) as ch:
            fallback = await ch.declare_exchange("fallback", "fanout")
            lost = await ch.declare_queue("", exclusive=True)
            await lost.bind(fallback)
            delayed = await ch.declare_exchange(
                "delayed",
                DELAYED,
                arguments={"x-delayed-type": "direct", "alternate-exchange": "fallback"},
            )
            downstream = await ch.declare_exchange("downstream", "direct")
            await downstream.bind(delayed, "k")
            q = await ch.declare_queue("", exclusive=True)
            await q.bind(downstream, "k")
            bound, unbound = Recorder(), Recorder()
            await q.consume(bound.on_message, no_ack=True)
            await lost.consume(unbound.on_message, no_ack=True)
            await publish(delayed, "k", "via downstream", delay=1000)
            await publish(delayed, "other", "to the alternate", delay=1000)
            await asyncio.sleep(0.9)
            assert bound.got == unbound.got == []
            await asyncio.sleep(0.2)
            assert bound.bodies == ["via downstream"]
            assert unbound.bodies == ["to the alternate"]
            assert bound.got[0][2]["x-delay"] == -1000

    async with in_process_broker(tmp_path) as url:
        await aio(scenario, url)


async def test_mandatory_delayed_message_is_returned_at_once_and_still_delivered(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """RabbitMQ's plugin: a delayed message has no route when published (its ``route`` returns
    nothing), so ``mandatory`` returns it with 312 NO_ROUTE; it is delivered when due anyway."""

    async def scenario(url: str) -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            ch = await connection.channel(on_return_raises=False)
            returned: list[tuple[str, float]] = []
            ch.return_callbacks.add(
                lambda _sender, message: returned.append((message.body.decode(), now()))
            )
            exchange, q = await setup(ch)
            recorder = Recorder()
            await q.consume(recorder.on_message, no_ack=True)
            start = now()
            await publish(exchange, "k", "delayed", delay=2000, mandatory=True)
            await publish(exchange, "k", "routed now", mandatory=True)
            await publish(exchange, "nowhere", "unroutable", mandatory=True)
            await asyncio.sleep(0.1)
            assert [body for body, _at in returned] == ["delayed", "unroutable"]
            assert recorder.bodies == ["routed now"]
            await asyncio.sleep(2)
            assert recorder.bodies == ["routed now", "delayed"]
            assert 2 - EARLY <= recorder.got[1][1] - start < 2 + SLACK

    async with in_process_broker(tmp_path) as url:
        await aio(scenario, url)


@pytest.mark.parametrize("backend", ["log", "rocksdb"])
async def test_restart_keeps_due_times(
    mock_clock: trio.testing.MockClock, tmp_path: Path, backend: str
) -> None:
    """A durable exchange's persistent delayed messages survive restarts and come out at their
    original due time, or at once when it passed while the broker was down; transient ones and
    those of a non-durable exchange are gone.

    Flushes run in worker threads, and the mock clock jumps while it waits for one; so a publish
    with its confirm takes some mock time, and due times are checked against that window."""
    data = tmp_path / "data"
    start = trio.current_time()

    async def publish_all(url: str) -> dict[str, tuple[float, float]]:
        windows = {}
        async with channel(url) as ch:
            exchange, _q = await setup(ch, durable=True, queue="jobs")
            for delay in (10_000, 20_000, 40_000):
                before = now()
                await publish(exchange, "k", f"p{delay}", delay=delay, persistent=True)
                windows[f"p{delay}"] = (before + delay / 1000, now() + delay / 1000)
            await publish(exchange, "k", "transient", delay=10_000)
            scratch, _ = await setup(ch, name="scratch", queue="scratch-q")
            await publish(scratch, "k", "non-durable exchange", delay=10_000, persistent=True)
        return windows

    async def collect(
        url: str, until: float
    ) -> tuple[list[tuple[str, float, dict[str, Any]]], float]:
        """What arrives until ``until``, and when the consumer started."""
        async with channel(url) as ch:
            q = await ch.declare_queue("jobs", durable=True)
            recorder = Recorder()
            await q.consume(recorder.on_message, no_ack=True)
            consuming = now()
            await asyncio.sleep(until - (now() - start))
            return recorder.got, consuming

    def on_time(body: str, at: float) -> bool:
        # Late by at most a few jumps of the mock clock over flushes in worker threads (the
        # restarts are 5 s and 15 s away from these due times).
        earliest, latest = due[body]
        return earliest - EARLY <= at < latest + 1

    async with in_process_broker(data, backend) as url:
        due = await aio(publish_all, url)
        await trio.sleep_until(start + 5)
    async with in_process_broker(data, backend) as url:  # restarted before the first is due
        first, _consuming = await aio(collect, url, 15)
    assert [body for body, _at, _h in first] == ["p10000"]
    assert on_time("p10000", first[0][1])
    await trio.sleep_until(start + 25)  # down while the second comes due
    async with in_process_broker(data, backend) as url:
        rest, consuming = await aio(collect, url, 45)
    assert [body for body, _at, _h in rest] == ["p20000", "p40000"]
    # Overdue: routed at once when the broker starts, so waiting when the consumer comes (the
    # mock clock may jump over the start-up's work in threads, so it is measured from there).
    assert rest[0][1] - consuming < 1
    assert on_time("p40000", rest[1][1])
    assert rest[0][2]["x-delay"] == -20_000


async def test_deleting_the_exchange_drops_its_pending_messages(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    data = tmp_path / "data"

    async def publish_then_delete(url: str) -> None:
        async with channel(url) as ch:
            exchange, _q = await setup(ch, durable=True, queue="jobs")
            await publish(exchange, "k", "dropped", delay=1000, persistent=True)
            await exchange.delete()
            # A new exchange of the same name starts with nothing pending.
            exchange, _q = await setup(ch, durable=True, queue="jobs")
            await publish(exchange, "k", "kept", delay=3000, persistent=True)
            await asyncio.sleep(2)
            q = await ch.declare_queue("jobs", durable=True)
            assert await q.get(fail=False) is None

    async def drain(url: str) -> list[str]:
        async with channel(url) as ch:
            q = await ch.declare_queue("jobs", durable=True)
            bodies = []
            while (message := await q.get(fail=False, no_ack=True)) is not None:
                bodies.append(message.body.decode())
            return bodies

    async with in_process_broker(data) as url:
        await aio(publish_then_delete, url)
    await trio.sleep(5)
    async with in_process_broker(data) as url:  # nor does it come back after a restart
        await trio.sleep(0.1)
        assert await aio(drain, url) == ["kept"]


# -- real clock, pika --------------------------------------------------------------------------


def test_declare_arguments_are_checked_as_rabbitmq_does() -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
        ({"x-delayed-type": 7}, "Invalid argument, 'x-delayed-type' must be an existing"),
        ({"x-delayed-type": "no-such-type"}, "unknown exchange type 'no-such-type'"),
        (
            {"x-delayed-type": DELAYED},
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
    ]
    with running_broker() as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        for arguments, text in cases:
            ch = connection.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                ch.exchange_declare("bad", DELAYED, arguments=arguments)
            assert refused.value.reply_code == 406
            assert text in refused.value.reply_text
        ch = connection.channel()
        ch.exchange_declare("good", DELAYED, arguments={"x-delayed-type": "headers"})
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as inequivalent:
            ch.exchange_declare("good", DELAYED, arguments={"x-delayed-type": "fanout"})
        assert inequivalent.value.reply_code == 406
        ch = connection.channel()
        ch.exchange_declare("bad", "direct", passive=False)  # nothing was left behind
        connection.close()


def test_pika_end_to_end_with_the_real_clock() -> None:
    with running_broker() as broker:
        ch = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        ch.confirm_delivery()
        ch.exchange_declare("jobs", DELAYED, arguments={"x-delayed-type": "fanout"})
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, "jobs")
        # Each publish is confirmed: the broker takes the message's time between the two.
        published: dict[str, tuple[float, float]] = {}
        for delay in (300, 100, 200, None):
            headers = None if delay is None else {"x-delay": delay}
            sent = time.monotonic()
            ch.basic_publish(
                "jobs", "any", str(delay).encode(), pika.BasicProperties(headers=headers)
            )
            published[str(delay)] = (sent, time.monotonic())
        consuming = time.monotonic()  # a message due before the consumer is there comes at once
        arrivals = []
        for method, properties, body in ch.consume(queue, auto_ack=True, inactivity_timeout=1):
            if method is None:
                break
            arrivals.append((body.decode(), time.monotonic(), properties.headers))
            if len(arrivals) == 4:
                break
        ch.connection.close()
        assert [body for body, _at, _headers in arrivals] == ["None", "100", "200", "300"]
        for body, at, headers in arrivals[1:]:
            delay_s = int(body) / 1000
            sent, confirmed = published[body]
            assert sent + delay_s - 0.01 <= at < max(confirmed + delay_s, consuming) + 0.15
            assert headers == {"x-delay": -int(body)}


def test_confirm_waits_for_the_delayed_store_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a durable exchange a persistent delayed message is confirmed once it is on disk in the
    exchange's store; if that write fails it is nacked. Transient ones are confirmed at once."""
    real_sync = segment_module.Segment.sync

    def slow_sync(self: segment_module.Segment, *, indexes: bool = True) -> None:
        time.sleep(1.0)
        real_sync(self, indexes=indexes)

    # The faults are injected into the log backend's segments: run on it whatever backend the
    # session tests (``nox -s backends`` sets the variable for every test broker).
    monkeypatch.setenv(DURABLE_BACKEND_ENV, "log")
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as b:
        ch = pika.BlockingConnection(pika.URLParameters(b.url)).channel()
        ch.confirm_delivery()
        ch.exchange_declare("d", DELAYED, durable=True, arguments={"x-delayed-type": "direct"})
        persistent = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 60_000})
        transient = pika.BasicProperties(delivery_mode=1, headers={"x-delay": 60_000})
        ch.basic_publish("d", "k", b"warm-up", persistent)
        monkeypatch.setattr(segment_module.Segment, "sync", slow_sync)
        started = time.monotonic()
        ch.basic_publish("d", "k", b"transient", transient)
        # Not after a (1 s) fsync; the margin is for a loaded 2-core CI machine.
        assert time.monotonic() - started < 0.8
        started = time.monotonic()
        ch.basic_publish("d", "k", b"persistent", persistent)
        assert time.monotonic() - started >= 0.9  # the ack came after the fsync

        def failing_sync(self: segment_module.Segment, *, indexes: bool = True) -> None:
            raise OSError(errno.EIO, "injected I/O error")

        monkeypatch.setattr(segment_module.Segment, "sync", failing_sync)
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("d", "k", b"lost", persistent)
        ch.connection.close()


@pytest.mark.parametrize("backend", ["log", "rocksdb"])
def test_kill_9_keeps_confirmed_persistent_delayed_messages(tmp_path: Path, backend: str) -> None:
    """Confirmed persistent delayed messages survive ``kill -9``: one that came due while the
    broker was down comes out at once after the restart, one still pending at its original due
    time. The broker takes a message's time between its publish and its confirm; "after the
    restart" counts from when the restarted broker accepts connections, so that a slow start
    (a busy machine) is not taken for lateness."""
    with start_broker_process(tmp_path, durable_backend=backend) as broker:
        ch = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        ch.confirm_delivery()
        ch.exchange_declare("d", DELAYED, durable=True, arguments={"x-delayed-type": "direct"})
        ch.queue_declare("jobs", durable=True)
        ch.queue_bind("jobs", "d", "k")
        sent = time.monotonic()
        for delay in (1500, 3500):
            properties = pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay})
            ch.basic_publish("d", "k", str(delay).encode(), properties)  # confirmed
        confirmed = time.monotonic()
        broker.kill()  # right after the confirms; down while the first comes due
    time.sleep(max(0.0, confirmed + 1.7 - time.monotonic()))
    with start_broker_process(tmp_path, durable_backend=backend) as broker:
        ready = time.monotonic()
        ch = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        arrivals = []
        for method, _properties, body in ch.consume("jobs", auto_ack=True, inactivity_timeout=5):
            if method is None:
                break
            arrivals.append((body.decode(), time.monotonic()))
            if len(arrivals) == 2:
                break
        ch.connection.close()
        assert [body for body, _at in arrivals] == ["1500", "3500"]
        # Overdue: at once (a connection and a consume later), not 1.5 s after the broker's
        # recovery (its delay counted again).
        assert arrivals[0][1] - ready < 0.8
        # At its original due time; at once if that passed while the broker was starting.
        assert sent + 3.5 - 0.01 <= arrivals[1][1] < max(confirmed + 3.5, ready) + 0.5


# -- units -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "delay"),
    [
        (5000, 5000),
        (-1, -1),
        (1500.9, 1500),
        (-0.5, 0),
        ("250", 250),
        ("+7", 7),
        (b"42", 42),
        ("1.5", None),
        (" 5", None),
        ("abc", None),
        (True, None),
        (float("nan"), None),
        ({"a": 1}, None),
    ],
)
def test_parse_delay(value: object, delay: int | None) -> None:
    assert parse_delay({"x-delay": value}) == delay  # type: ignore[dict-item]


def test_the_plugin_is_installed_through_its_entry_point() -> None:
    assert isinstance(load_exchange_types()[DELAYED], DelayedMessageExchange)
