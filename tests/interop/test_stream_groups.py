"""Consumer groups on a partitioned stream (``x-stream-group``), with pika over real sockets: three
members split six partitions, rebalance when one leaves (and when one joins, cancelling the old
owner with basic.cancel), commit with their acks, and resume after a broker kill -9 with nothing
committed lost and no gap."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import httpx
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.group_members import PARTITIONS, Member, pump, settle
from tests.support.polling import eventually
from tqbroker.testing import RunningBroker, start_broker_process

pytestmark = pytest.mark.timeout(90)

STREAM = {"x-queue-type": "stream"}


def declare_partitioned(ch: BlockingChannel, name: str = "orders") -> None:
    ch.exchange_declare(name, "x-key-partition", durable=True)
    for p in range(PARTITIONS):
        ch.queue_declare(f"{name}-{p}", durable=True, arguments=STREAM)
        ch.queue_bind(f"{name}-{p}", name, str(p))


def publish(ch: BlockingChannel, count: int, start: int = 0) -> None:
    ch.confirm_delivery()
    for n in range(start, start + count):
        ch.basic_publish("orders", f"key-{n}", b"%d" % n)


def test_three_members_split_six_partitions_and_rebalance(
    tqbroker_thread: RunningBroker, channel: BlockingChannel
) -> None:
    declare_partitioned(channel)
    members = [Member(tqbroker_thread.url) for _ in range(2)]  # together: one rebalance
    settle(members, 0.6)
    members.append(Member(tqbroker_thread.url))  # later: takes a partition from each
    settle(members, 0.6)
    publish(channel, 600)
    pump(members, 600)
    owned = [m.partitions for m in members]
    assert [len(p) for p in owned] == [2, 2, 2]  # each partition read by exactly one member
    assert set().union(*owned) == set(range(PARTITIONS))
    # The late joiner took partitions from the others: their consumers there were cancelled.
    assert members[0].cancelled
    assert members[1].cancelled
    assert not members[2].cancelled
    assert all(not (set(m.cancelled) & m.partitions) for m in members)

    members[2].close()  # one leaves: its two partitions go to the other two
    publish(channel, 600, start=600)
    pump(members[:2], 1200 - len(members[2].received))
    after = [{p for p, o in m.received if o >= 100} for m in members[:2]]
    assert sorted(len(p) for p in after) == [3, 3]
    # Nothing lost, nothing skipped: every partition's offsets read, from 0 to its end.
    by_partition: dict[int, set[int]] = defaultdict(set)
    for member in members:
        for p, offset in member.received:
            by_partition[p].add(offset)
    assert sum(len(offsets) for offsets in by_partition.values()) == 1200
    for offsets in by_partition.values():
        assert offsets == set(range(len(offsets)))
    for member in members[:2]:
        member.close()


def test_a_new_group_starts_where_x_stream_offset_says_and_members_resume_the_commit(
    tqbroker_thread: RunningBroker, channel: BlockingChannel
) -> None:
    declare_partitioned(channel)
    publish(channel, 60)
    late = Member(tqbroker_thread.url, "late", offset="next")
    settle([late])
    publish(channel, 60, start=60)
    pump([late], 60)
    settle([late])
    assert sorted(late.bodies) == list(range(60, 120))  # none of those before it came
    late.close()
    again = Member(tqbroker_thread.url, "late", offset="first")  # the commit wins over "first"
    publish(channel, 6, start=120)
    pump([again], 6)
    settle([again])
    assert sorted(again.bodies) == list(range(120, 126))
    again.close()


def test_group_argument_rules(tqbroker_thread: RunningBroker) -> None:
    for arguments, code in (
        ({"x-stream-group": ""}, 406),
        ({"x-stream-group": 7}, 406),
        ({"x-stream-group": "g", "x-stream-automatic-offset-tracking": True}, 406),
    ):
        connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
        ch = connection.channel()
        ch.queue_declare("rules", durable=True, arguments=STREAM)
        ch.basic_qos(prefetch_count=10)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            ch.basic_consume("rules", lambda *a: None, consumer_tag="t", arguments=arguments)
        assert raised.value.reply_code == code
        connection.close()


def test_committed_offsets_survive_a_broker_kill(tmp_path: Path) -> None:
    with start_broker_process(tmp_path, durable_backend="log") as broker:
        ch = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        declare_partitioned(ch)
        members = [Member(broker.url) for _ in range(3)]
        settle(members)
        publish(ch, 900)
        for member in members:  # past 150 acks each, deliveries stay unacked (uncommitted)
            member.hold_after = 150
        pump(members, 450)
        for member in members:
            member.hold = True
        settle(members, 0.6)  # the commits of what was acked reach the disk (flushes: 0.2 s)
        acked: dict[int, int] = defaultdict(lambda: -1)
        held: dict[int, set[int]] = defaultdict(set)
        for member in members:
            for p, offset in member.acked:
                acked[p] = max(acked[p], offset)
            for p, offset in member.held:
                held[p].add(offset)

        # Deterministic: every partition not read to its end has unacked deliveries at the
        # kill (the members' credit, 20 each), right after its last ack.
        # (A stream counts what is durable: wait for the last flush to take in all 900.)
        def all_900() -> list[int]:
            sizes = [
                ch.queue_declare(f"orders-{p}", passive=True).method.message_count
                for p in range(PARTITIONS)
            ]
            return sizes if sum(sizes) == 900 else []

        sizes = eventually(all_900)
        unfinished = [p for p in range(PARTITIONS) if acked[p] + 1 < sizes[p]]
        assert unfinished
        for p in unfinished:
            assert held[p], f"partition {p}: nothing unacked at the kill"
            assert min(held[p]) == acked[p] + 1
        broker.kill()
    with start_broker_process(tmp_path, durable_backend="log") as broker:
        members = [Member(broker.url) for _ in range(3)]
        settle(members)
        pump(members, 900 - sum(acked[p] + 1 for p in range(PARTITIONS)))
        settle(members)
        by_partition: dict[int, list[int]] = defaultdict(list)
        for member in members:
            for p, offset in member.received:
                by_partition[p].append(offset)
        for p in range(PARTITIONS):
            # Resumes right after the last ack, then reads on without a gap. (Members joining
            # one after another move partitions: a new owner reads again what the previous one
            # had not acked yet, at least once, as Kafka's rebalances do.)
            if not by_partition[p]:  # it had been read to its end before the kill
                assert p not in unfinished
                continue
            assert min(by_partition[p]) == acked[p] + 1
            resumed = set(by_partition[p])
            assert resumed == set(range(acked[p] + 1, acked[p] + 1 + len(resumed)))
            assert held[p] <= resumed  # what was unacked at the kill came again
        total = sum(acked[p] + 1 + len(set(by_partition[p])) for p in range(PARTITIONS))
        assert total == 900
        for member in members:
            member.close()


def test_a_partition_nobody_stands_by_for_waits_at_its_commit(
    tqbroker_thread: RunningBroker, channel: BlockingChannel
) -> None:
    declare_partitioned(channel)
    first = Member(tqbroker_thread.url, rejoin=False)
    settle([first], 0.6)
    second = Member(tqbroker_thread.url)
    settle([first, second], 0.6)
    assert len(first.cancelled) == 3  # revoked, and it does not consume them again
    second.close()  # now three partitions have no consumer of the group
    publish(channel, 120)
    settle([first], 1.0)
    assert len(first.partitions) == 3
    third = Member(tqbroker_thread.url)  # takes the waiting ones, from their commits
    pump([first, third], 120)
    assert sorted(first.bodies + third.bodies) == list(range(120))
    first.close()
    third.close()


def filled_stream_reader(
    broker: RunningBroker, channel: BlockingChannel, stream: str, count: int
) -> tuple[pika.BlockingConnection, BlockingChannel]:
    """A stream holding ``count`` messages (bodies "0", "1"...), and a reader's connection and
    channel with a prefetch of 10."""
    channel.queue_declare(stream, durable=True, arguments=STREAM)
    channel.confirm_delivery()
    for n in range(count):
        channel.basic_publish("", stream, b"%d" % n)
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10)
    return connection, ch


def test_a_requeued_message_comes_again_and_stays_uncommitted(
    tqbroker_thread: RunningBroker, channel: BlockingChannel
) -> None:
    """Streams never take a message back, but a group reader that requeues (nack with requeue,
    basic.recover) gets it again, and the group's commit does not pass it; a reject without
    requeue settles it."""
    connection, ch = filled_stream_reader(tqbroker_thread, channel, "retry", 5)
    seen: list[int] = []
    arguments = {"x-stream-group": "workers", "x-stream-offset": "first"}
    for method, properties, _body in ch.consume("retry", arguments=arguments, inactivity_timeout=1):
        if method is None:
            break
        offset = properties.headers["x-stream-offset"]
        seen.append(offset)
        if offset == 2 and seen.count(2) == 1:
            ch.basic_nack(method.delivery_tag, requeue=True)  # again, please
        elif offset == 3:
            ch.basic_reject(method.delivery_tag, requeue=False)  # give up on it
        else:
            ch.basic_ack(method.delivery_tag)
    assert seen[:2] == [0, 1]
    assert seen.count(2) == 2  # delivered again after the requeue...
    assert sorted(set(seen)) == [0, 1, 2, 3, 4]
    with httpx.Client(
        base_url=tqbroker_thread.http_url, auth=("guest", "guest"), timeout=10
    ) as http:
        # ...and acked; the rejected one is settled too
        eventually(
            lambda: (
                http.get("/topics/retry/groups/workers").json()["partitions"][0]["committed"] == 5
            )
        )
    connection.close()


def test_a_multiple_ack_commits_the_group_and_gives_the_credit_back(
    tqbroker_thread: RunningBroker, channel: BlockingChannel
) -> None:
    """A ``multiple`` ack settles its deliveries at once (``Queue.ack_many``): the group's commit
    moves past the last of them, once the cursor settled every one, and the consumer gets its
    whole prefetch back (it would stall if the credit were counted short)."""
    connection, ch = filled_stream_reader(tqbroker_thread, channel, "batch-acks", 50)
    seen: list[int] = []
    arguments = {"x-stream-group": "batchers", "x-stream-offset": "first"}
    for method, properties, _body in ch.consume(
        "batch-acks", arguments=arguments, inactivity_timeout=2
    ):
        if method is None:
            break
        seen.append(properties.headers["x-stream-offset"])
        if len(seen) % 10 == 0:  # the whole prefetch window, acked at once
            ch.basic_ack(method.delivery_tag, multiple=True)
    assert seen == list(range(50))
    with httpx.Client(
        base_url=tqbroker_thread.http_url, auth=("guest", "guest"), timeout=10
    ) as http:
        eventually(
            lambda: (
                http.get("/topics/batch-acks/groups/batchers").json()["partitions"][0]["committed"]
                == 50
            )
        )
    connection.close()
