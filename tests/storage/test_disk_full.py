"""A full disk under a running broker: a real 8 MiB tmpfs as the data directory, mostly taken by a
filler file, and persistent 32-64 KiB messages published with confirms until the broker refuses.

What the broker does (``broker/flusher.py``, ``server/channel.py``): a failed write or fsync fails
the flush, and every publish waiting on it is nacked; the backend is then unhealthy and the queues
on it refuse publishes (nacked at once) until a flush succeeds again. So the client sees nacks, not
a dropped connection; it never sees an ack for a message that is not on disk. The broker keeps
serving (other queues, other connections, reads of the full queue) and, once space is freed and it
is restarted (SIGTERM or SIGKILL), every acked message comes back.

Needs root (``mount -t tmpfs``); skipped otherwise."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.support.polling import eventually
from tests.support.rawamqp import RawAMQP, SocketClosed
from tqbroker.backends.log import LogBackend
from tqbroker.model import Message
from tqbroker.protocol.methods import (
    BasicAck,
    BasicNack,
    BasicProperties,
    ConfirmSelect,
    ConfirmSelectOk,
    QueueDeclare,
    QueueDeclareOk,
)
from tqbroker.testing import BrokerProcess, start_broker_process

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="mounts a tmpfs: needs root on Linux",
)

QUEUE = "full-disk"
HEADROOM = 1536 * 1024  # left free on the tmpfs once the filler is written
PERSISTENT = pika.BasicProperties(delivery_mode=2)
ROCKSDB = pytest.param(
    "rocksdb",
    marks=pytest.mark.skipif(
        importlib.util.find_spec("tqbroker_rocksdb") is None,
        reason="tqbroker-rocksdb not installed",
    ),
)
CONNECTION_ERRORS = (pika.exceptions.AMQPConnectionError, pika.exceptions.StreamLostError)


def params(broker: BrokerProcess) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(broker.host, broker.port, blocked_connection_timeout=10)


def alive(broker: BrokerProcess) -> bool:
    return broker.proc.poll() is None


def start(
    brokers: list[BrokerProcess],
    tmpfs: Path,
    tmp_path: Path,
    *,
    disk_free_limit: str = "0",
    durable_backend: str | None = None,
) -> BrokerProcess:
    """``python -m tqbroker`` on the tmpfs; its log goes to ``broker.log`` (not on the tmpfs).
    The disk alarm is off unless asked for: these tests fill the disk past it on purpose."""
    broker = start_broker_process(
        tmpfs / "data",
        durable_backend=durable_backend,
        stderr=tmp_path / "broker.log",
        extra_args=["--disk-free-limit", disk_free_limit],
        log_level="INFO",
    )
    brokers.append(broker)
    return broker


def fill(tmpfs: Path) -> Path:
    """Take all but ``HEADROOM`` of the tmpfs."""
    stat = os.statvfs(tmpfs)
    free = stat.f_bavail * stat.f_frsize
    assert free > HEADROOM + 1024 * 1024, free
    filler = tmpfs / "filler"
    with open(filler, "wb") as f:
        f.write(b"\xa5" * (free - HEADROOM))
    return filler


def message(i: int, rng: random.Random) -> bytes:
    return f"{i:06d}|".encode() + rng.randbytes(rng.randint(32 * 1024, 64 * 1024))


def number(body: bytes) -> int:
    return int(body[:6])


@dataclass
class Published:
    bodies: dict[int, bytes] = field(default_factory=dict)
    acked: list[int] = field(default_factory=list)
    nacked: list[int] = field(default_factory=list)
    connection_error: BaseException | None = None


def publish_until_refused(
    broker: BrokerProcess, rng: random.Random, refusals: int = 3
) -> Published:
    """Publish one confirmed message at a time until ``refusals`` nacks (or a connection error,
    which the broker should never cause)."""
    out = Published()
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    channel.confirm_delivery()
    try:
        for i in range(1000):
            body = out.bodies[i] = message(i, rng)
            try:
                channel.basic_publish("", QUEUE, body, PERSISTENT, mandatory=True)
            except pika.exceptions.NackError:
                out.nacked.append(i)
                if len(out.nacked) >= refusals:
                    break
            else:
                out.acked.append(i)
    except CONNECTION_ERRORS as exc:
        out.connection_error = exc
    finally:
        with contextlib.suppress(*CONNECTION_ERRORS):
            connection.close()
    return out


def drain(broker: BrokerProcess) -> list[bytes]:
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    bodies = []
    while True:
        method, _props, body = channel.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    connection.close()
    return bodies


def declare(broker: BrokerProcess) -> None:
    connection = pika.BlockingConnection(params(broker))
    connection.channel().queue_declare(QUEUE, durable=True)
    connection.close()


def assert_still_serving(broker: BrokerProcess, expect_at_least: int) -> None:
    """While the disk is full: the process is alive, a new connection works, a transient
    queue does a round trip, and the full durable queue can still be read (a message taken
    and given back)."""
    assert alive(broker)
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    channel.confirm_delivery()
    scratch = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", scratch, b"in memory", pika.BasicProperties(delivery_mode=1))
    method, _props, body = channel.basic_get(scratch, auto_ack=True)
    assert method is not None
    assert body == b"in memory"
    # The durable queue still refuses: nacked, the channel stays open.
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", QUEUE, b"refused", PERSISTENT)
    count = channel.queue_declare(QUEUE, passive=True).method.message_count
    assert count >= expect_at_least
    method, _props, body = channel.basic_get(QUEUE)
    assert method is not None
    assert number(body) == 0
    channel.basic_reject(method.delivery_tag, requeue=True)
    # A consumer on it gets its messages too (given back unacked when the channel closes).
    seen: list[int] = []
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=5)
    consumer.basic_consume(QUEUE, lambda _ch, _m, _p, b: seen.append(number(b)))
    deadline = time.monotonic() + 10
    while len(seen) < 5 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)
    assert seen == list(range(5))
    connection.close()
    assert alive(broker)


def wait_until_accepted(broker: BrokerProcess, timeout: float = 8.0) -> float:
    """Once space is freed the broker takes persistent publishes again, without a restart (its
    flusher retries once a second). Returns how long it took; the probe queue is deleted."""
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    channel.confirm_delivery()
    scratch = channel.queue_declare("disk-back", durable=True).method.queue
    began = time.monotonic()

    def accepted() -> bool:
        channel.basic_publish("", scratch, b"space again", PERSISTENT)
        return True

    eventually(
        accepted,
        timeout,
        0.2,
        what="a persistent publish confirmed with free space again",
        ignoring=(pika.exceptions.NackError,),
    )
    took = time.monotonic() - began
    channel.queue_delete(scratch)
    connection.close()
    return took


def check_recovered(published: Published, bodies: list[bytes]) -> None:
    numbers = [number(b) for b in bodies]
    assert numbers == sorted(set(numbers)), "out of order or duplicated"
    for n, body in zip(numbers, bodies, strict=True):
        assert body == published.bodies[n], n
    missing = set(published.acked) - set(numbers)
    assert not missing, f"acked and lost: {sorted(missing)}"
    # Anything else is a nacked one (a nack does not promise the message is gone).
    assert set(numbers) - set(published.acked) <= set(published.nacked)


@pytest.mark.parametrize("restart", ["sigterm", "sigkill", "sigterm-while-full"])
def test_full_disk_nacks_and_loses_no_acked_message(
    tmpfs: Path, tmp_path: Path, brokers: list[BrokerProcess], restart: str
) -> None:
    rng = random.Random(restart)
    broker = start(brokers, tmpfs, tmp_path)
    declare(broker)
    filler = fill(tmpfs)

    published = publish_until_refused(broker, rng)
    # Refused with nacks on a channel that stays open, never with a dropped connection.
    assert published.connection_error is None, published.connection_error
    assert len(published.nacked) == 3
    # Publishes are confirmed one at a time: acks up to the first failed write, then nacks.
    assert published.acked == list(range(len(published.acked)))
    assert published.nacked == list(range(len(published.acked), len(published.acked) + 3))
    assert len(published.acked) >= 10  # it did fill the headroom
    assert_still_serving(broker, len(published.acked))

    if restart == "sigterm-while-full":
        broker.stop()  # the final flush fails: an unclean stop
        filler.unlink()
    elif restart == "sigkill":
        filler.unlink()
        broker.kill()
    else:
        filler.unlink()
        wait_until_accepted(broker)
        assert broker.stop() == 0
    broker = start(brokers, tmpfs, tmp_path)
    check_recovered(published, drain(broker))

    # And with space again, persistent publishes are confirmed.
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", QUEUE, b"000000|after", PERSISTENT)
    connection.close()
    assert [number(b) for b in drain(broker)] == [0]
    broker.stop()


# -- many publishes in flight ----------------------------------------------------------------------


def burst(broker: BrokerProcess, rng: random.Random, count: int) -> tuple[Published, bool]:
    """Publish ``count`` messages back to back on a confirm channel (raw AMQP: pika's
    blocking channel waits for each confirm) and collect every ack / nack. Returns what was
    published and whether the broker closed the socket."""
    out = Published()
    with RawAMQP(broker.host, broker.port, timeout=10) as amqp:
        amqp.handshake()
        amqp.open_channel(1)
        amqp.call(1, ConfirmSelect(False), ConfirmSelectOk)
        amqp.call(1, QueueDeclare(queue=QUEUE, durable=True), QueueDeclareOk)
        for i in range(count):
            out.bodies[i] = message(i, rng)
            amqp.publish(1, "", QUEUE, out.bodies[i], properties=BasicProperties(delivery_mode=2))
        # Delivery tag t is message t - 1; the broker settles publishes in order.
        settled = 0
        try:
            while settled < count:
                method = amqp.next_frame(timeout=10).method
                if isinstance(method, BasicAck | BasicNack):
                    tag = method.delivery_tag
                    target = out.acked if isinstance(method, BasicAck) else out.nacked
                    target.extend(range(settled if method.multiple else tag - 1, tag))
                    settled = max(settled, tag)
        except SocketClosed as exc:
            out.connection_error = exc
            return out, True
    return out, False


@pytest.mark.parametrize("restart", ["sigterm", "sigkill"])
def test_full_disk_with_many_publishes_in_flight(
    tmpfs: Path, tmp_path: Path, brokers: list[BrokerProcess], restart: str
) -> None:
    rng = random.Random(f"burst-{restart}")
    broker = start(brokers, tmpfs, tmp_path)
    declare(broker)
    filler = fill(tmpfs)

    published, closed = burst(broker, rng, 80)  # about 3.8 MB into 1.5 MiB of space
    assert not closed, published.connection_error
    assert published.nacked, "the disk never filled up"
    assert sorted(published.acked + published.nacked) == list(range(80))
    assert published.acked == list(range(len(published.acked)))  # no ack after a nack
    assert_still_serving(broker, len(published.acked))

    filler.unlink()
    if restart == "sigterm":
        wait_until_accepted(broker)
        assert broker.stop() == 0
    else:
        broker.kill()
    broker = start(brokers, tmpfs, tmp_path)
    check_recovered(published, drain(broker))
    broker.stop()


@pytest.mark.parametrize("backend", ["log", ROCKSDB])
def test_a_broker_restarted_on_a_full_disk_starts_blocks_publishers_and_serves_readers(
    tmpfs: Path, tmp_path: Path, brokers: list[BrokerProcess], backend: str
) -> None:
    """Probe of the issue: a restart while the disk is full was a crash loop (the unused RocksDB
    backend could not open; a classic queue's reservation could not be written). Now the broker
    starts with its disk alarm set, blocks publishers, and consumers get every acked message,
    on either durable backend (RocksDB, which cannot open read-write without writing a new
    MANIFEST, is opened read-only until a flush finds space)."""
    rng = random.Random("restart-full")
    broker = start(brokers, tmpfs, tmp_path, durable_backend=backend)
    declare(broker)
    connection = pika.BlockingConnection(params(broker))
    connection.channel().queue_declare("stream", durable=True, arguments={"x-queue-type": "stream"})
    connection.close()
    fill(tmpfs)
    published = publish_until_refused(broker, rng)
    assert published.acked
    assert published.connection_error is None
    fill_completely(tmpfs).rename(tmpfs / "filler2")  # not one byte left
    broker.kill()

    broker = start(brokers, tmpfs, tmp_path, disk_free_limit="50MB", durable_backend=backend)
    blocked: list[str] = []
    connection = pika.BlockingConnection(params(broker))
    connection.add_on_connection_blocked_callback(lambda _c, f: blocked.append(f.method.reason))
    channel = connection.channel()
    channel.basic_publish("", "stream", b"during the alarm")  # read; then the connection blocks
    deadline = time.monotonic() + 10
    while not blocked:
        assert time.monotonic() < deadline, "publisher never blocked"
        connection.process_data_events(0.1)
    assert blocked == ["low on disk"]
    check_recovered(published, drain(broker))
    assert alive(broker)
    log = (tmp_path / "broker.log").read_text()
    assert "disk resource limit alarm set" in log
    assert "Traceback" not in log
    if importlib.util.find_spec("tqbroker_rocksdb") is not None:
        # RocksDB, the durable backend or not, opened: read-only (it writes when it opens
        # read-write), where it used to be left out or stop the start.
        assert "opened read-only" in log


# -- in process: a checkpoint that cannot be written ---------------------------------------------


def fill_completely(tmpfs: Path) -> Path:
    filler = tmpfs / "filler"
    chunk = b"\xa5" * 65536
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\xa5")
    return filler


def test_failed_checkpoint_write_is_retried_once_space_is_back(tmpfs: Path) -> None:
    """An ack makes the next flush rewrite the checkpoint (``state.cbor``), which cannot be
    written: the flush fails, and the backend must still want a flush so that the flusher's
    retry makes it healthy again once there is space (otherwise it refuses publishes until a
    restart)."""
    backend = LogBackend()
    backend.open(tmpfs / "data")
    store = backend.open_queue("/", "q")
    properties = BasicProperties(delivery_mode=2).encode()
    for body in (b"first", b"second"):
        store.push(Message("", "q", properties, body), persistent=True)
    work = backend.begin_flush()
    assert work is not None
    work()
    popped = store.pop()
    assert isinstance(popped, tuple)
    assert popped[1].body == b"first"
    store.ack(popped[0])  # only the checkpoint is left to write
    filler = fill_completely(tmpfs)

    work = backend.begin_flush()
    assert work is not None
    with pytest.raises(OSError, match="No space left"):
        work()
    assert not backend.healthy

    filler.unlink()
    assert backend.needs_flush, "nothing left to retry: the backend stays unhealthy"
    work = backend.begin_flush()
    assert work is not None
    work()
    assert backend.healthy
    backend.close()
    backend = LogBackend()
    backend.open(tmpfs / "data")
    store = backend.open_queue("/", "q")
    entries = [store.pop(), store.pop()]
    assert [e[1].body if e else None for e in entries] == [b"second", None]
    backend.close()
