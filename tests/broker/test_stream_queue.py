"""Stream queues below the wire: retention on Trio's clock (``x-max-age`` removes whole segments
whose newest message is older than the limit, never the active one; MockClock runs days in
milliseconds), compaction on it (latest per key, tombstones after their grace, stable offsets),
interval strings, consumer checks. The stream is a real log backend stream in a
temporary directory. Wire-level scenarios are in tests/interop/test_streams.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.support.channel_double import RecordingChannel
from tests.support.storage import flush
from tqbroker import clock
from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.stream import LogStream
from tqbroker.broker.arguments import QueueArguments, parse_interval
from tqbroker.broker.consumer import Consumer
from tqbroker.broker.deadletter import Reason
from tqbroker.broker.queue import Queue
from tqbroker.broker.streams.queue import StreamQueue
from tqbroker.model import Message
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.errors import AMQPError, ReplyCode
from tqbroker.protocol.methods import BasicProperties


class NoHost:
    """A stream is never dead-lettered from nor unused: its host is never asked."""

    def dead_letter(self, queue: Queue, message: Message, reason: Reason) -> None:
        raise AssertionError("a stream does not dead-letter")

    def queue_unused(self, queue: Queue) -> None:
        raise AssertionError("a stream is not auto-deleted")


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LogBackend]:
    backend = LogBackend(segment_bytes=2_000)
    backend.open(tmp_path)
    yield backend
    backend.close()


def append(queue: StreamQueue, count: int) -> None:
    raw = BasicProperties().encode()
    for n in range(count):
        queue.publish(Message("", queue.name, raw, b"%06d" % n + b"." * 200, None, clock.now_ms()))


async def test_max_age_drops_old_segments_on_the_clock(
    autojump_clock: trio.abc.Clock, backend: LogBackend
) -> None:
    async with trio.open_nursery() as nursery:
        stream = backend.open_stream("/", "s")
        queue = StreamQueue(
            "/",
            "s",
            stream,
            host=NoHost(),
            backend_name="log",
            arguments=QueueArguments.parse({"x-max-age": "1D"}),
            flusher=None,
        )
        nursery.start_soon(queue.run)
        append(queue, 30)  # several segments of ~2 kB
        await trio.sleep(12 * 3600)
        append(queue, 1)
        await trio.sleep(120)  # a retention check or two: nothing is a day old yet
        assert stream.first_offset == 0
        await trio.sleep(13 * 3600)  # the first 30 messages are now over a day old
        assert stream.first_offset > 0
        assert stream.next_offset == 31
        assert stream.read(30) is not None  # the active segment always stays
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("text", "ms"),
    [("7D", 7 * 86_400_000), ("12h", 43_200_000), ("30m", 1_800_000), ("1Y", 31_536_000_000)],
)
def test_intervals(text: str, ms: int) -> None:
    assert parse_interval(text) == ms


@pytest.mark.parametrize("text", ["", "7", "D", "1d", "1 h", "-1h", "1.5h"])
def test_invalid_intervals(text: str) -> None:
    assert parse_interval(text) is None


async def test_offset_tracking_needs_a_consumer_tag(backend: LogBackend) -> None:
    """pika and aio-pika always send a tag; a client that lets the broker choose one cannot
    resume under it, so tracking without a tag is refused."""
    queue = StreamQueue(
        "/",
        "s",
        backend.open_stream("/", "s"),
        host=NoHost(),
        backend_name="log",
        arguments=QueueArguments(),
        flusher=None,
    )
    tracking: FieldTable = {"x-stream-automatic-offset-tracking": True}
    with pytest.raises(AMQPError) as refused:
        queue.check_consumer("", no_ack=False, prefetch_count=10, arguments=tracking)
    assert refused.value.code == ReplyCode.PRECONDITION_FAILED
    queue.check_consumer("reader", no_ack=False, prefetch_count=10, arguments=tracking)


def append_keyed(queue: StreamQueue, keys_and_bodies: list[tuple[str, bytes]]) -> None:
    raw = BasicProperties().encode()
    for key, body in keys_and_bodies:
        queue.publish(Message("", key, raw, body, None, clock.now_ms()))


async def compaction_pass(queue: StreamQueue, done: int | None = None) -> None:
    """Wait for a compaction pass to finish after the ``done``-th (now's count if None): its
    work runs in a thread, which the mock clock does not wait for, so the clock may run far
    ahead while it runs and a later pass may come sooner than the test's own sleeps say."""
    if done is None:
        done = queue.compactions
    while queue.compactions == done:  # noqa: ASYNC110 (the pass is in a thread)
        await trio.sleep(0.5)


def surviving(stream: LogStream) -> dict[int, tuple[str, bytes]]:
    """Offset -> (key, body) of every record still there."""
    found = {}
    position = stream.first_offset
    while (record := stream.read_from(position)) is not None:
        found[record.offset] = (record.message.routing_key, record.message.body)
        position = record.offset + 1
    return found


async def test_compaction_keeps_the_latest_per_key_and_drops_tombstones_after_grace(
    autojump_clock: trio.abc.Clock, backend: LogBackend
) -> None:
    async with trio.open_nursery() as nursery:
        stream = backend.open_stream("/", "c")
        arguments: FieldTable = {
            "x-stream-cleanup-policy": "compact",
            "x-stream-delete-retention": "1h",
        }
        queue = StreamQueue(
            "/",
            "c",
            stream,
            host=NoHost(),
            backend_name="log",
            arguments=QueueArguments.parse(arguments),
            flusher=None,
        )
        nursery.start_soon(queue.run)
        pad = b"." * 200
        # Offsets 0..59: six keys, ten values each; 60: a tombstone for k0; then more of k5
        # so that the tombstone's segment is closed (the active segment is never compacted).
        append_keyed(queue, [(f"k{n % 6}", b"%06d" % n + pad) for n in range(60)])
        append_keyed(queue, [("k0", b"")])
        append_keyed(queue, [("k5", b"%06d" % n + pad) for n in range(61, 80)])
        assert len(surviving(stream)) == 80
        await compaction_pass(queue)
        kept = surviving(stream)
        latest = {key: offset for offset, (key, _body) in sorted(kept.items())}
        assert latest["k0"] == 60  # the tombstone, within its grace
        for key in ("k1", "k2", "k3", "k4"):
            assert latest[key] == 54 + int(key[1])  # the last value each was given
            assert [o for o, (k, _) in kept.items() if k == key] == [latest[key]]
        for offset, (_key, body) in kept.items():  # offsets never change
            assert body == b"" or int(body[:6]) == offset
        assert stream.next_offset == 80
        done = queue.compactions  # a pass during the sleep counts (see compaction_pass)
        await trio.sleep(3600 - 60)  # the tombstone's grace is over at the next pass
        await compaction_pass(queue, done)
        kept = surviving(stream)
        assert all(key != "k0" for key, _body in kept.values())
        assert stream.read(60) is None
        nursery.cancel_scope.cancel()


async def test_a_reader_steps_over_compacted_offsets(
    autojump_clock: trio.abc.Clock, backend: LogBackend
) -> None:
    async with trio.open_nursery() as nursery:
        stream = backend.open_stream("/", "r")
        queue = StreamQueue(
            "/",
            "r",
            stream,
            host=NoHost(),
            backend_name="log",
            arguments=QueueArguments.parse({"x-stream-cleanup-policy": "compact"}),
            flusher=None,
        )
        nursery.start_soon(queue.run)
        append_keyed(queue, [("same", b"%06d" % n + b"." * 200) for n in range(40)])
        await compaction_pass(queue)
        flush(backend)  # readers stop at the durable end
        channel = RecordingChannel()
        consumer = Consumer(
            "c", queue, channel, no_ack=False, exclusive=False, prefetch_count=100,
            arguments={"x-stream-offset": "first"},
        )  # fmt: skip
        queue.add_consumer(consumer)
        await trio.sleep(1)
        offsets = [offset for offset, _message in channel.delivered]
        assert offsets[0] > 0  # the old values of the key are gone...
        assert offsets == sorted(offsets)
        assert offsets[-1] == 39  # ...and the reader went on to the end
        nursery.cancel_scope.cancel()


class BackedUpChannel(RecordingChannel):
    """A consumer's channel whose client reads nothing: it takes deliveries until ``high``
    body bytes are waiting (the writer's high water), then no more (``credit`` 0)."""

    def __init__(self, high: int) -> None:
        super().__init__()
        self.high = high

    def waiting(self) -> int:
        return sum(len(body) for body in self.bodies)

    def can_deliver(self) -> bool:
        return self.waiting() < self.high

    def credit(self) -> int:
        return super().credit() if self.can_deliver() else 0


async def test_a_client_that_reads_nothing_stops_the_deliveries(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    """Stream deliveries go out in batches; each batch asks for credit again, so a backed-up
    socket holds back the rest: about one batch (1 MiB) past the high water, not everything
    the prefetch allows (before the fix: 60 records of 768 KiB, all into a 4 MiB buffer)."""
    backend = LogBackend(segment_bytes=64 << 20)
    backend.open(tmp_path)
    try:
        async with trio.open_nursery() as nursery:
            queue = StreamQueue(
                "/",
                "big",
                backend.open_stream("/", "big"),
                host=NoHost(),
                backend_name="log",
                arguments=QueueArguments(),
                flusher=None,
            )
            nursery.start_soon(queue.run)
            raw = BasicProperties().encode()
            for n in range(60):
                body = b"%06d" % n * (1 << 17)
                queue.publish(Message("", "big", raw, body, None, clock.now_ms()))
            flush(backend)
            channel = BackedUpChannel(high=4 << 20)
            consumer = Consumer(
                "c", queue, channel, no_ack=False, exclusive=False, prefetch_count=1000,
                arguments={"x-stream-offset": "first"},
            )  # fmt: skip
            queue.add_consumer(consumer)
            await trio.sleep(1)
            assert 4 << 20 <= channel.waiting() <= 5 << 20
            assert consumer.unacked == len(channel.deliveries) < 60
            # The client reads, the socket drains, the queue is woken (as the writer does):
            # the deliveries go on where they stopped.
            channel.high = 1 << 40
            queue.wake()
            await trio.sleep(1)
            assert [message_id for message_id, _ in channel.delivered] == list(range(60))
            nursery.cancel_scope.cancel()
    finally:
        backend.close()
