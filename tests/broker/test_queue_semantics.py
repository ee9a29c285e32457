"""RabbitMQ's queue features at the vhost level, driven by Trio's MockClock (pytest-trio's
``autojump_clock``): message TTL, dead-lettering and ``x-death``, length limits, priorities and
the delivery limit. Hours of queue time pass in milliseconds. Real-socket scenarios with pika are
in tests/interop/test_queue_features.py."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from tests.support.channel_double import RecordingChannel
from tests.support.vhosts import declare_queue, memory_vhost
from tqbroker import clock
from tqbroker.broker.classic import ClassicQueue
from tqbroker.broker.classic_dispatch import EXPIRE_BATCH
from tqbroker.broker.consumer import Consumer
from tqbroker.broker.deadletter import parse_expiration
from tqbroker.broker.queue import Queue, QueueFull
from tqbroker.broker.vhost import VirtualHost
from tqbroker.model import Message
from tqbroker.protocol.methods import BasicProperties


@pytest.fixture
async def vhost() -> AsyncIterator[VirtualHost]:
    """A vhost on the memory backend. Tests take ``autojump_clock`` themselves (pytest-trio
    hands the run a clock only from a test's own arguments)."""
    async with trio.open_nursery() as nursery:
        yield memory_vhost(nursery)
        nursery.cancel_scope.cancel()


def publish(vhost: VirtualHost, queue: Queue | str, body: bytes, **properties: Any) -> None:
    """Publish through the default exchange, as a channel does."""
    name = queue if isinstance(queue, str) else queue.name
    props = BasicProperties(**properties)
    message = Message("", name, props.encode(), body, props, timestamp_ms=clock.now_ms())
    for target in vhost.route(vhost.default_exchange, name, props):
        target.publish(message)


def x_death(message: Message) -> list[dict[str, Any]]:
    """A dead-lettered message's ``x-death`` header: a list of tables, most recent first."""
    assert message.properties.headers is not None
    deaths = message.properties.headers["x-death"]
    assert isinstance(deaths, list)
    return deaths  # type: ignore[return-value]


def get_all(queue: Queue) -> list[Message]:
    messages = []
    while (entry := queue.get()) is not None:
        assert isinstance(entry, tuple)
        queue.ack(entry[0], None)
        messages.append(entry[1])
    return messages


def bodies(messages: list[Message]) -> list[bytes]:
    return [m.body for m in messages]


def consume(queue: Queue) -> tuple[Consumer, RecordingChannel]:
    recorder = RecordingChannel()
    consumer = Consumer(
        "c", queue, recorder, no_ack=False, exclusive=False, prefetch_count=0, arguments={}
    )
    queue.add_consumer(consumer)
    return consumer, recorder


def declare_retry_topology(vhost: VirtualHost) -> Queue:
    """RabbitMQ's retry pattern: ``work`` dead-letters rejected messages to ``retry``, whose
    1 s TTL dead-letters them back to ``work``. Returns ``work``."""
    declare_queue(
        vhost,
        "retry",
        **{
            "x-message-ttl": 1000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "work",
        },
    )
    return declare_queue(
        vhost, "work", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "retry"}
    )


def declare_with_dlq(vhost: VirtualHost, **arguments: Any) -> tuple[Queue, Queue]:
    """Queue ``q`` with ``arguments``, dead-lettering to queue ``dlq`` (default exchange)."""
    dlq = declare_queue(vhost, "dlq")
    dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    return declare_queue(vhost, "q", **arguments, **dead_letter), dlq


# -- message TTL -------------------------------------------------------------------------------


async def test_queue_ttl_expires_messages_at_the_head_into_the_dead_letter_queue(
    autojump_clock: trio.abc.Clock,
    vhost: VirtualHost,
) -> None:
    dlq = declare_queue(vhost, "dlq")
    work = declare_queue(vhost, "work", **{"x-message-ttl": 60_000, "x-dead-letter-exchange": ""})
    publish(vhost, work, b"late", headers={"CC": ["dlq"]})
    await trio.sleep(59)
    assert work.message_count == 1
    await trio.sleep(2)  # past the TTL: the queue expires it with nobody asking
    assert work.message_count == 0
    [dead] = get_all(dlq)
    headers = dead.properties.headers
    assert headers is not None
    [death] = x_death(dead)
    assert death["reason"] == "expired"
    assert death["queue"] == "work"
    assert death["count"] == 1
    assert death["exchange"] == ""
    assert death["routing-keys"] == ["work", "dlq"]
    assert isinstance(death["time"], datetime.datetime)
    assert headers["x-first-death-reason"] == "expired"
    assert headers["x-first-death-queue"] == "work"


async def test_the_lower_of_queue_and_message_ttl_wins(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue = declare_queue(vhost, "q", **{"x-message-ttl": 10_000})
    publish(vhost, queue, b"short", expiration="1000")
    publish(vhost, queue, b"long", expiration="50000")
    await trio.sleep(2)
    assert queue.message_count == 1  # "short" went at 1 s
    await trio.sleep(9)
    assert queue.message_count == 0  # "long" capped by the queue's 10 s


async def test_per_message_ttl_expires_at_the_head_and_when_reached(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    """RabbitMQ classic queues expire only at the head: a short-lived message behind a long-lived
    one stays counted until it reaches the head, and is never delivered."""
    dlq = declare_queue(vhost, "dlq")
    queue = declare_queue(
        vhost, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    )
    publish(vhost, queue, b"patient", expiration="100000")
    publish(vhost, queue, b"hasty", expiration="1000")
    await trio.sleep(5)
    assert queue.message_count == 2
    assert bodies(get_all(queue)) == [b"patient"]  # "hasty" expired on the way
    dead = get_all(dlq)
    assert bodies(dead) == [b"hasty"]
    assert dead[0].properties.expiration is None  # removed so it cannot expire again
    assert dead[0].routing_key == "dlq"
    deaths = x_death(dead[0])
    assert deaths[0]["original-expiration"] == "1000"


async def test_expired_messages_are_never_delivered_to_consumers(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue = declare_queue(vhost, "q", **{"x-message-ttl": 1000})
    publish(vhost, queue, b"stale")
    await trio.sleep(0.5)
    publish(vhost, queue, b"fresh")
    await trio.sleep(0.7)  # "stale" is past its TTL
    _consumer, recorder = consume(queue)
    await trio.sleep(0.01)
    assert [m.body for _, m, _ in recorder.deliveries] == [b"fresh"]


async def test_ttl_zero_delivers_only_to_a_waiting_consumer(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue = declare_queue(vhost, "q", **{"x-message-ttl": 0})
    publish(vhost, queue, b"nobody there")
    assert queue.message_count == 0
    _consumer, recorder = consume(queue)
    publish(vhost, queue, b"taken at once")
    assert [m.body for _, m, _ in recorder.deliveries] == [b"taken at once"]


async def test_requeued_messages_keep_their_expiry(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue = declare_queue(vhost, "q", **{"x-message-ttl": 10_000})
    publish(vhost, queue, b"m")
    await trio.sleep(6)
    entry = queue.get()
    assert isinstance(entry, tuple)
    queue.requeue(entry[0], None)
    await trio.sleep(6)  # 12 s since publish: expired although requeued 6 s ago
    assert queue.message_count == 0


# -- dead-letter cycles ------------------------------------------------------------------------


async def test_automatic_dead_letter_cycle_is_dropped(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    """A queue dead-lettering expired messages to itself: RabbitMQ drops them."""
    queue = declare_queue(vhost, "loop", **{"x-message-ttl": 1000, "x-dead-letter-exchange": ""})
    publish(vhost, queue, b"m")
    await trio.sleep(5)
    assert queue.message_count == 0


async def test_retry_cycle_with_a_rejection_keeps_going(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    """work --rejected--> retry (TTL) --expired--> work: allowed, and x-death counts it."""
    work = declare_retry_topology(vhost)
    publish(vhost, work, b"job")
    for attempt in (1, 2, 3):
        entry = work.get()
        assert isinstance(entry, tuple), attempt
        work.reject(entry[0], None)
        await trio.sleep(1.5)
    entry = work.get()
    assert isinstance(entry, tuple)
    deaths = x_death(entry[1])
    counts = {(d["queue"], d["reason"]): d["count"] for d in deaths}
    assert counts == {("work", "rejected"): 3, ("retry", "expired"): 3}
    assert deaths[0]["queue"] == "retry"  # most recent first


# -- length limits -----------------------------------------------------------------------------


async def test_drop_head_dead_letters_with_reason_maxlen(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue, dlq = declare_with_dlq(vhost, **{"x-max-length": 2})
    for body in (b"1", b"2", b"3", b"4"):
        publish(vhost, queue, body)
    assert bodies(get_all(queue)) == [b"3", b"4"]
    dead = get_all(dlq)
    assert bodies(dead) == [b"1", b"2"]
    assert x_death(dead[0])[0]["reason"] == "maxlen"


async def test_max_length_bytes_counts_ready_body_bytes(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue = declare_queue(vhost, "q", **{"x-max-length-bytes": 10})
    publish(vhost, queue, b"aaaa")
    publish(vhost, queue, b"bbbb")
    publish(vhost, queue, b"cccc")  # 12 bytes: the head goes
    assert queue.message_count == 2
    assert bodies(get_all(queue)) == [b"bbbb", b"cccc"]


async def test_reject_publish_dlx_refuses_and_dead_letters(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue, dlq = declare_with_dlq(
        vhost, **{"x-max-length-bytes": 4, "x-overflow": "reject-publish-dlx"}
    )
    publish(vhost, queue, b"fits")
    with pytest.raises(QueueFull):
        publish(vhost, queue, b"x")
    assert bodies(get_all(queue)) == [b"fits"]
    dead = get_all(dlq)
    assert bodies(dead) == [b"x"]
    assert x_death(dead[0])[0]["reason"] == "maxlen"


async def test_reject_publish_does_not_dead_letter(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue, dlq = declare_with_dlq(vhost, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    publish(vhost, queue, b"1")
    with pytest.raises(QueueFull):
        publish(vhost, queue, b"2")
    assert get_all(dlq) == []


# -- priorities --------------------------------------------------------------------------------


async def test_priority_queue_serves_highest_first_capped_at_max(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue = declare_queue(vhost, "q", **{"x-max-priority": 5})
    publish(vhost, queue, b"none")
    publish(vhost, queue, b"p1", priority=1)
    publish(vhost, queue, b"p9", priority=9)  # above the maximum: treated as 5
    publish(vhost, queue, b"p5", priority=5)
    publish(vhost, queue, b"p3", priority=3)
    assert queue.message_count == 5
    assert bodies(get_all(queue)) == [b"p9", b"p5", b"p3", b"p1", b"none"]


async def test_priority_queue_requeue_goes_back_to_its_level(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue = declare_queue(vhost, "q", **{"x-max-priority": 2})
    publish(vhost, queue, b"low")
    publish(vhost, queue, b"high", priority=2)
    entry = queue.get()
    assert isinstance(entry, tuple)
    assert entry[1].body == b"high"
    queue.requeue(entry[0], None)
    assert bodies(get_all(queue)) == [b"high", b"low"]


# -- delivery limit ----------------------------------------------------------------------------


async def test_delivery_limit_counts_returns_and_dead_letters(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue, dlq = declare_with_dlq(vhost, **{"x-delivery-limit": 2})
    publish(vhost, queue, b"poison")
    seen_counts = []
    for _ in range(3):
        entry = queue.get()
        assert isinstance(entry, tuple)
        headers = entry[1].properties.headers or {}
        seen_counts.append(headers.get("x-delivery-count"))
        queue.requeue(entry[0], None)
    assert seen_counts == [None, 1, 2]
    assert queue.message_count == 0
    dead = get_all(dlq)
    assert bodies(dead) == [b"poison"]
    assert x_death(dead[0])[0]["reason"] == "delivery_limit"


async def test_delivery_limit_without_dlx_drops_and_counts(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost, caplog: pytest.LogCaptureFixture
) -> None:
    queue = declare_queue(vhost, "q", **{"x-delivery-limit": 0})
    publish(vhost, queue, b"poison")
    entry = queue.get()
    assert isinstance(entry, tuple)
    queue.requeue(entry[0], None)
    assert queue.message_count == 0
    assert isinstance(queue, ClassicQueue)
    assert queue.dropped_at_delivery_limit == 1
    assert "x-delivery-limit" in caplog.text


async def test_rejected_without_requeue_is_dead_lettered_once(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    dlq = declare_queue(vhost, "dlq")
    queue = declare_queue(
        vhost, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    )
    consumer, recorder = consume(queue)
    publish(vhost, queue, b"bad")
    await trio.sleep(0.01)
    [(message_id, _message, _redelivered)] = recorder.deliveries
    queue.remove_consumer(consumer)
    queue.reject(message_id, consumer)
    dead = get_all(dlq)
    assert bodies(dead) == [b"bad"]
    assert x_death(dead[0])[0]["reason"] == "rejected"


# -- review regressions ------------------------------------------------------------------------


async def test_limit_counts_after_delivery_to_a_waiting_consumer(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    """RabbitMQ delivers first and applies the limit to what stays: a burst into a one-message
    queue reaches a consumer with credit in full."""
    queue = declare_queue(vhost, "q", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    _consumer, recorder = consume(queue)
    for n in range(50):
        publish(vhost, queue, b"%d" % n)  # would raise QueueFull if counted before delivery
    assert len(recorder.deliveries) == 50


async def test_requeue_over_the_limit_drops_the_head(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    queue, dlq = declare_with_dlq(vhost, **{"x-max-length": 2})
    publish(vhost, queue, b"1")
    entry = queue.get()
    assert isinstance(entry, tuple)
    publish(vhost, queue, b"2")
    publish(vhost, queue, b"3")
    queue.requeue(entry[0], None)  # "1" is back at the head: three ready, one too many
    assert bodies(get_all(queue)) == [b"2", b"3"]
    assert bodies(get_all(dlq)) == [b"1"]


async def test_no_dead_lettering_after_the_queue_is_deleted(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    dlq = declare_queue(vhost, "dlq")
    queue = declare_queue(
        vhost, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    )
    publish(vhost, queue, b"m")
    entry = queue.get()
    assert isinstance(entry, tuple)
    vhost.delete_queue("q", if_unused=False, if_empty=False, owner=None)
    queue.reject(entry[0], None)
    assert get_all(dlq) == []


async def test_mass_expiry_in_batches_loses_nothing(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    """Thousands of messages expiring at once are dead-lettered in batches (the actor lets
    other tasks run in between), every one of them."""
    queue, dlq = declare_with_dlq(vhost, **{"x-message-ttl": 1000})
    for n in range(3 * EXPIRE_BATCH + 7):
        publish(vhost, queue, b"%d" % n)
    await trio.sleep(1.5)
    assert queue.message_count == 0
    assert dlq.message_count == 3 * EXPIRE_BATCH + 7


async def test_mass_expiry_lets_other_tasks_run_between_batches(
    mock_clock: trio.testing.MockClock, vhost: VirtualHost
) -> None:
    """A hand-driven clock: after the TTL passes, this task gets to run while the queue is part
    way through expiring (the broker keeps serving others), and then everything is gone."""
    total = 3 * EXPIRE_BATCH + 7
    queue, dlq = declare_with_dlq(vhost, **{"x-message-ttl": 1000})
    for n in range(total):
        publish(vhost, queue, b"%d" % n)
    await trio.testing.wait_all_tasks_blocked()
    mock_clock.jump(1.5)
    seen = []
    for _ in range(100):
        await trio.lowlevel.checkpoint()
        seen.append(dlq.message_count)
        if seen[-1] == total:
            break
    assert seen[-1] == total
    assert any(0 < count < total for count in seen), seen


async def test_repeated_death_counts_in_the_first_entry(
    autojump_clock: trio.abc.Clock, vhost: VirtualHost
) -> None:
    """RabbitMQ keeps the first death's time, exchange and routing keys in a (queue, reason)
    entry, counts repeats and moves it to the front; x-last-death-* names the latest."""
    work = declare_retry_topology(vhost)
    publish(vhost, work, b"job")
    first_death_time = None
    for _ in range(2):
        entry = work.get()
        assert isinstance(entry, tuple)
        work.reject(entry[0], None)
        await trio.sleep(60)
        entry_now = work.get()
        assert isinstance(entry_now, tuple)
        deaths = x_death(entry_now[1])
        rejected = next(d for d in deaths if d["reason"] == "rejected")
        first_death_time = first_death_time or rejected["time"]
        assert rejected["time"] == first_death_time
        assert rejected["exchange"] == ""  # where it was first published
        assert rejected["routing-keys"] == ["work"]
        headers = entry_now[1].properties.headers
        assert headers["x-last-death-reason"] == "expired"  # type: ignore[index]
        assert headers["x-first-death-reason"] == "rejected"  # type: ignore[index]
        work.requeue(entry_now[0], None)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("60000", 60000),
        ("0", 0),
        ("+5", 5),
        ("-1", "{value_negative,-1}"),
        ("10abc", '{leftover_string,"abc"}'),
        ("1.5", '{leftover_string,".5"}'),
        ("", "no_integer"),
        ("soon", "no_integer"),
    ],
)
def test_expiration_parsed_as_rabbitmq_does(value: str, parsed: int | str) -> None:
    assert parse_expiration(value) == parsed


def _message(queue: Queue, body: bytes, **properties: Any) -> Message:
    props = BasicProperties(**properties)
    return Message("", queue.name, props.encode(), body, props, timestamp_ms=clock.now_ms())


async def test_a_run_of_publishes_keeps_each_message_s_rules(
    vhost: VirtualHost, autojump_clock: trio.testing.MockClock
) -> None:
    """``ClassicQueue.publish_run`` pushes a run at once, but a message with its own TTL in
    the run still expires (and is dead-lettered) as ``publish`` would have it, in order."""
    dead = declare_queue(vhost, "dead")
    queue = declare_queue(
        vhost, "run", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    )
    assert isinstance(queue, ClassicQueue)
    run = [
        _message(queue, b"a"),
        _message(queue, b"b", expiration="1000"),
        _message(queue, b"c"),
        _message(queue, b"d", expiration="0"),  # no consumer waits: expired at once
        _message(queue, b"e"),
    ]
    published = queue.stats.publish
    durabilities, error = queue.publish_run(run)
    assert error is None
    assert durabilities == [None] * 5  # one a message; none to wait for
    assert queue.stats.publish - published == 4
    assert queue.message_count == 4
    await trio.sleep(2)
    assert [m.body for m in get_all(queue)] == [b"a", b"c", b"e"]
    assert [m.body for m in get_all(dead)] == [b"d", b"b"]
