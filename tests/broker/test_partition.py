"""A stream ``Partition`` below every protocol, over a real log backend stream and its real
flusher: appends and their flush tickets, reads that stop at the high watermark, the long
poll (``wait_beyond``), committed offsets made durable, and the ``StreamService`` fetch that
waits for records. Wire-level stream behaviour is in tests/interop/test_streams.py."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pika
import pytest
import trio
import trio.testing

from tests.support.polling import eventually_async
from tests.support.sim_disk import SimDisk
from tests.support.storage import flush
from tqbroker.backends.log import LogBackend
from tqbroker.backends.streams import ProducerState
from tqbroker.broker.flusher import Flusher
from tqbroker.broker.streams.partition import Partition, make_durable
from tqbroker.broker.streams.service import ProducerRecord, StreamService, Unavailable
from tqbroker.config import BrokerConfig
from tqbroker.model import Message
from tqbroker.storage_env import StorageEnv
from tqbroker.testing import start_broker

# A TQF1 body's head: magic, frame count, the offset the next read starts at.
FRAMES_HEAD = struct.Struct("<4sIq")


def message(n: int) -> Message:
    return Message("", "k", b"", b"record-%04d" % n)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LogBackend]:
    backend = LogBackend()
    backend.open(tmp_path)
    yield backend
    backend.close()


async def test_reads_stop_at_the_high_watermark(backend: LogBackend) -> None:
    partition = Partition(backend.open_stream("/", "s"), None)
    first, durabilities, error = partition.append([message(n) for n in range(5)])
    assert (first, len(durabilities), error) == (0, 5, None)
    assert partition.log_end_offset == 5
    assert partition.high_watermark == 0  # written, not durable: no reader sees it
    assert partition.read_many(0, 100) == []
    assert partition.read_from(0) is None
    assert partition.read_frames(0, None, 1 << 20) == ([], 0)
    flush(backend)
    assert partition.high_watermark == 5
    assert [r.offset for r in partition.read_many(0, 100)] == [0, 1, 2, 3, 4]
    partition.append([message(5)])
    assert [r.offset for r in partition.read_many(3, 100)] == [3, 4]  # 5 is not durable
    frames, next_offset = partition.read_frames(0, None, 1 << 20)
    assert frames
    assert next_offset == 5
    assert partition.offset_for_timestamp(2**62) == 5  # none that late: the high watermark
    assert partition.clamp(-3) == 0
    assert partition.clamp(99) == 5
    assert partition.message_count == 5


async def test_one_flush_ticket_per_record_batch(backend: LogBackend) -> None:
    flusher = Flusher(backend)
    partition = Partition(backend.open_stream("/", "s"), flusher)
    _first, one, _error = partition.append([message(0), message(1)])
    _first, two, _error = partition.append([message(2)])
    assert len({*one, *two}) == 1  # the same open batch: one ticket serves all three
    assert flusher.requested == 1


async def test_wait_beyond_returns_once_records_are_durable(backend: LogBackend) -> None:
    # A real flusher in the nursery (its fsync runs in a thread): Trio's real clock.
    flusher = Flusher(backend)
    partition = Partition(backend.open_stream("/", "s"), flusher)
    woke: list[bool] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)

        async def wait() -> None:
            woke.append(await partition.wait_beyond(0, trio.current_time() + 30))
            done.set()

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []  # nothing yet: it waits
        partition.append([message(0)])
        with trio.fail_after(30):
            await done.wait()
        assert woke == [True]
        assert partition.high_watermark == 1
        nursery.cancel_scope.cancel()


async def test_wait_beyond_gives_up_at_its_deadline_or_when_closed(
    autojump_clock: trio.abc.Clock, backend: LogBackend
) -> None:
    partition = Partition(backend.open_stream("/", "s"), None)
    started = trio.current_time()
    assert not await partition.wait_beyond(0, started + 5)
    assert trio.current_time() - started == pytest.approx(5)
    results: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def wait() -> None:
            results.append(await partition.wait_beyond(0, trio.current_time() + 3600))

        nursery.start_soon(wait)
        await trio.sleep(1)
        partition.close()  # the stream was deleted
    assert results == [False]
    assert trio.current_time() - started < 60


async def test_committed_offsets_are_made_durable(tmp_path: Path) -> None:
    backend = LogBackend()
    backend.open(tmp_path)
    flusher = Flusher(backend)
    partition = Partition(backend.open_stream("/", "s"), flusher)
    partition.append([message(n) for n in range(3)])
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        partition.commit_group_offset("g", 2)
        partition.store_offset("consumer-1", 1)
        partition.record_producer("p", 3, 7)
        assert await make_durable([partition, partition])
        nursery.cancel_scope.cancel()
    backend.close()
    reopened = LogBackend()
    reopened.open(tmp_path)
    again = Partition(reopened.open_stream("/", "s"), None)
    assert again.group_offsets == {"g": 2}
    assert again.tracked_offsets == {"consumer-1": 1}
    assert again.producer_state("p") == ProducerState(3, 7)
    assert again.high_watermark == 3
    reopened.close()


async def test_a_service_fetch_at_the_end_waits_for_records() -> None:
    """``StreamService.fetch`` with ``wait_until`` (Kafka's ``fetch.max.wait.ms``): at the high
    watermark it waits until a produce made records durable, then answers them; with none, it
    answers empty at its deadline."""
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery)
        assert running.broker is not None
        streams = StreamService(running.broker.vhosts["/"])
        await streams.declare("t", 1, {})
        start = trio.current_time()
        empty = await streams.fetch("t", 0, offset=0, max_bytes=1 << 20, wait_until=start + 0.2)
        assert trio.current_time() - start >= 0.2
        assert FRAMES_HEAD.unpack_from(empty)[1:] == (0, 0)  # no frame; next offset 0
        bodies: list[bytes] = []
        done = trio.Event()

        async def fetch() -> None:
            deadline = trio.current_time() + 30
            bodies.append(
                await streams.fetch("t", 0, offset=0, max_bytes=1 << 20, wait_until=deadline)
            )
            done.set()

        nursery.start_soon(fetch)
        await trio.testing.wait_all_tasks_blocked()
        assert bodies == []
        landed = await streams.produce("t", [ProducerRecord(b"hello", key="k")])
        assert landed == [(0, 0)]
        with trio.fail_after(30):
            await done.wait()
        frames, next_offset = FRAMES_HEAD.unpack_from(bodies[0])[1:]
        assert (frames, next_offset) == (1, 1)
        assert b"hello" in bodies[0]
        nursery.cancel_scope.cancel()


async def test_a_produced_record_lands_in_one_partition_however_the_topic_is_bound() -> None:
    """A key that the topic's exchange routes to two partitions (an extra binding) still puts
    each record in one of them, as Kafka's produce does."""
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery)
        assert running.broker is not None
        vhost = running.broker.vhosts["/"]
        streams = StreamService(vhost)
        await streams.declare("d", 2, {})
        for n in range(2):  # each partition's key now leads to both
            vhost.bind_queue(f"d-{1 - n}", "d", str(n), {}, None)
        records = [ProducerRecord(b"v%d" % n, key=f"key-{n}") for n in range(20)]
        landed = await streams.produce("d", records)
        assert landed is not None
        assert len(landed) == 20
        held = {id(p): p.high_watermark for p in streams.partitions("d")}  # each once
        assert sum(held.values()) == 20
        nursery.cancel_scope.cancel()


async def test_a_follower_partition_copies_its_leader_and_truncates(tmp_path: Path) -> None:
    """The log's replication primitives through the ``Partition``: a follower appends the
    leader's frames verbatim in the leader's epoch, finds where it diverged
    (``end_offset_for_epoch``) and truncates there, durably; each replica has its own id."""
    backend = LogBackend()
    backend.open(tmp_path)
    leader = Partition(backend.open_stream("/", "leader"), Flusher(backend))
    follower = Partition(backend.open_stream("/", "follower"), Flusher(backend))
    await leader.begin_epoch(3)
    for n in range(10):  # a frame each (a flush closes the open batch)
        leader.append([message(n)])
        flush(backend)
    frames, _next = leader.read_frames(0, None, 1 << 20)
    end, durability = await follower.append_frames(frames, 3)
    assert end == 10
    assert durability is not None
    flush(backend)
    assert follower.high_watermark == 10
    assert follower.leader_epoch == 3
    assert list(follower.epoch_history) == [(3, 0)]
    assert follower.read_frames(0, None, 1 << 20)[0] == frames  # byte-identical
    assert follower.replica_id != leader.replica_id
    assert follower.end_offset_for_epoch(3) == 10
    await follower.truncate_to(4)
    assert (follower.log_end_offset, follower.high_watermark) == (4, 4)
    assert [r.offset for r in follower.read_many(0, 100)] == [0, 1, 2, 3]
    backend.close()


async def test_a_truncation_on_a_stuck_disk_leaves_the_event_loop_free(tmp_path: Path) -> None:
    """A follower's truncation fsyncs in worker threads: on a disk whose fsyncs hang, the
    Trio thread keeps running, reads below the cut go on, ``changing`` says a change is under
    way and ``settled`` returns once it is over (a role taking over the partition waits for
    it); nothing fsyncs on the Trio thread."""
    disk = SimDisk(tmp_path)
    backend = LogBackend()
    backend.open(tmp_path, StorageEnv.default(disk))
    follower = Partition(backend.open_stream("/", "follower"), Flusher(backend))
    for n in range(6):
        follower.append([message(n)])
        flush(backend)
    disk.stall()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follower.truncate_to, 3)
            await eventually_async(lambda: disk.stalled_syncs > 0, what="the intent's fsync")
            assert follower.changing
            assert [r.offset for r in follower.read_many(0, 2)] == [0, 1]
            nursery.start_soon(follower.settled)
            await trio.sleep(0.1)
            assert follower.changing
            disk.unstall()
        assert not follower.changing
    assert disk.loop_syncs == []
    assert follower.log_end_offset == 3
    backend.close()


async def test_a_damaged_frame_fails_the_partition_and_the_health_check(tmp_path: Path) -> None:
    """Strict reads: a frame damaged on disk below the high watermark is never stepped over. A
    read through the stream service is refused (503 to HTTP), the partition says why, and
    ``/health`` names it."""
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, config)
        assert running.broker is not None
        streams = StreamService(running.broker.vhosts["/"])
        await streams.declare("t", 1, {})
        for n in range(300):  # a record batch each: the damage below takes one record
            await streams.produce("t", [ProducerRecord(b"record-%04d" % n + b"." * 40)])
        nursery.cancel_scope.cancel()  # a clean stop: the next start scans nothing
    damage(tmp_path, b"record-0150")
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, config)
        assert running.broker is not None
        streams = StreamService(running.broker.vhosts["/"])
        assert [r.offset for r in streams.read("t", 0, offset=0, limit=100)] == list(range(100))
        # An AMQP reader gets records below the damage at most (those its reads of the log
        # reached before it), then basic.cancel: the queue failed (a consume is then 541).
        got = await trio.to_thread.run_sync(consume_all, running.port, "t-0")
        expected = [b"record-%04d" % n + b"." * 40 for n in range(150)]
        assert got == expected[: len(got)]
        assert running.broker.vhosts["/"].queues["t-0"].failure is not None
        with pytest.raises(Unavailable, match="partition 0 of topic 't' failed"):
            streams.read("t", 0, offset=100, limit=100)
        assert streams.partition("t", 0).failure is not None
        async with httpx.AsyncClient(base_url=running.http_url) as client:
            health = await client.get("/health")
            assert health.status_code == 503
            assert health.json()["failed_partitions"][0]["queue"] == "t-0"
            read = await client.get("/topics/t/messages?offset=140", auth=("guest", "guest"))
            assert read.status_code == 503
        nursery.cancel_scope.cancel()


def damage(data_dir: Path, needle: bytes) -> None:
    """Flip a bit of the record holding ``needle`` in its segment file."""
    victim = next(p for p in data_dir.rglob("*.log") if needle in p.read_bytes())
    data = bytearray(victim.read_bytes())
    data[data.index(needle) + 3] ^= 1
    victim.write_bytes(bytes(data))


def consume_all(port: int, queue: str) -> list[bytes]:
    """Read a stream from its first record with pika until the broker cancels the consumer
    (or 30 s of silence)."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        got: list[bytes] = []
        arguments = {"x-stream-offset": "first"}
        for method, _properties, body in channel.consume(
            queue, arguments=arguments, inactivity_timeout=30
        ):
            if method is None:
                break
            got.append(body)
            channel.basic_ack(method.delivery_tag)
        return got
    finally:
        connection.close()
