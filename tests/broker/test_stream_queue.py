"""Stream queues below the wire: retention on Trio's clock (``x-max-age`` removes whole segments
whose newest message is older than the limit, never the active one; MockClock runs days in
milliseconds), interval strings, consumer checks. The stream is a real log backend stream in a
temporary directory. Wire-level scenarios are in tests/interop/test_streams.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tqbroker import clock
from tqbroker.backends.log import LogBackend
from tqbroker.broker.stream import StreamQueue, parse_interval
from tqbroker.model import Message
from tqbroker.protocol.errors import AMQPError, ReplyCode
from tqbroker.protocol.methods import BasicProperties


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
        queue = StreamQueue("/", "s", stream, arguments={"x-max-age": "1D"}, flusher=None)
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
    queue = StreamQueue("/", "s", backend.open_stream("/", "s"), arguments={}, flusher=None)
    tracking = {"x-stream-automatic-offset-tracking": True}
    with pytest.raises(AMQPError) as refused:
        queue.check_consumer("", no_ack=False, prefetch_count=10, arguments=tracking)
    assert refused.value.code == ReplyCode.PRECONDITION_FAILED
    queue.check_consumer("reader", no_ack=False, prefetch_count=10, arguments=tracking)
