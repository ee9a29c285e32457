"""The benchmark suite's workloads: what each does to a broker and the figures it measures.

Workloads (1 KiB bodies; the load comes from worker processes using the lean raw-socket client):
- publish-transient: one publisher, transient messages, no confirms, into one queue; timed until
  the queue holds them all;
- publish-persistent: one publisher, persistent messages to a durable queue, confirms with a
  window of 256 unconfirmed (tqbroker confirms after fsync);
- consume: one consumer drains a queue filled beforehand (prefetch 1000, ``multiple`` ack
  every 100);
- latency: a publisher at a fixed 2k msg/s stamps each body, a consumer takes the difference
  on arrival; p50, p99 and p99.9 (the first quarter second is warm-up, left out);
- fanout, fanout-16: a fanout exchange bound to 4 (16) queues, one publisher (no confirms),
  deliveries per second (consumers: see the modes); fanout-16 publishes a quarter as many;
- stream: confirmed publish into a stream (window 256), then one consumer reads it from
  ``x-stream-offset=first``;
- memory-durable: a fresh broker, RSS growth per message after N persistent messages queued
  on a durable queue; then kill -9 and restart on the same data: seconds until the queue answers
  with all N again, per GB of message bodies (unclean recovery);
- memory-transient: the same RSS growth with transient messages on a non-durable queue.

Generator modes (``Settings.mode``): ``multi``, a connection per consumer (fanout: per queue, in
at most ``CONSUMER_PROCESSES`` processes); ``single``, one connection and process per side.

Responsibilities: the sizes (``Settings``, ``SMOKE``), one ``Measure`` per row and run, each
workload (``WORKLOADS``) and the rows it fills (``ROWS_OF``); with ``--profile``, py-spy
records tqbroker during every timed phase.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from loadgen import BODY_SIZE, Consume, ConsumeEach, Job, PacedPublish, Publish, RunResult, run_jobs
from procstats import Memory, cpu_seconds, memory, profiling
from rawclient import BrokerError, RawClient, publish_frames
from targets import Target


@dataclass(frozen=True)
class Settings:
    """How big and how many: the sizes of every run (``SMOKE`` for ``--smoke``)."""

    runs: int = 3
    messages: int = 200_000  # per throughput run
    queued: int = 1_000_000  # the memory and recovery backlog
    body_size: int = BODY_SIZE
    window: int = 256  # unconfirmed publishes
    prefetch: int = 1000
    ack_every: int = 100
    fanout_queues: int = 4
    mode: str = "multi"  # or "single": one connection (and process) per side
    latency_rate: float = 2000.0
    latency_seconds: float = 10.0
    settle: float = 1.0  # seconds before reading RSS
    settle_window: float = 10.0  # RSS has settled when it fell < 1% over this many seconds
    settle_max: float = 180.0
    profile: str | None = None  # a directory: py-spy profiles of tqbroker, one per timed phase
    profile_format: str = "flamegraph"


SMOKE = Settings(
    runs=1,
    messages=2000,
    queued=2000,
    latency_seconds=1.0,
    settle=0.2,
    settle_window=0.5,
    settle_max=2.0,
)


@dataclass
class Measure:
    """One row's figure from one run on one target."""

    value: float
    wall: float  # seconds the figure was measured over
    broker_cpu: float | None  # broker CPU seconds during it
    client_cpu: float  # load generator CPU seconds during it
    detail: dict[str, float | int | str] = field(default_factory=dict)
    busiest_worker: float = 0.0  # the highest CPU share of one load generator process
    other_cpu: float = 0.0  # machine CPU seconds outside the broker and the load generator


Workload = Callable[[Target, Settings, str], dict[str, Measure]]

CONSUMER_PROCESSES = 2  # not one per consumer: 17 in fanout-16 starved the broker on 2 cores


def _throughput(result: RunResult, messages: int) -> Measure:
    return Measure(
        messages / result.wall,
        result.wall,
        result.broker_cpu,
        result.client_cpu,
        {
            "messages": messages,
            "client_us_per_msg": 1e6 * result.client_cpu / messages,
            "processes": len(result.outcomes),
        },
        result.busiest_worker,
        result.other_cpu,
    )


def _run(target: Target, jobs: list[Job], s: Settings, label: str) -> RunResult:
    """``run_jobs`` against the target. With ``--profile DIR``, py-spy records tqbroker's
    process while the workers run (not while queues are set up or filled), one file per timed
    phase in DIR."""
    if s.profile is None or target.name != "tqbroker" or target.pid is None:
        return run_jobs(target.endpoint, jobs, broker_pid=target.pid)
    with profiling(target.pid, Path(s.profile), s.profile_format, label):
        return run_jobs(target.endpoint, jobs, broker_pid=target.pid)


@contextlib.contextmanager
def _client(target: Target) -> Iterator[RawClient]:
    client = RawClient.connect(target.endpoint)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def _cleanup(target: Target, queues: list[str], exchanges: tuple[str, ...] = ()) -> Iterator[None]:
    """Delete the queues and exchanges afterwards, on a connection of its own (whatever
    happened: a failed run must not leave a backlog behind for the next)."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ConnectionError, BrokerError), _client(target) as client:
            for queue in queues:
                client.delete_queue(queue)
            for exchange in exchanges:
                client.delete_exchange(exchange)


def publish_transient(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.publish-transient.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=False)
        job = Publish(queue, s.messages, body_size=s.body_size, wait_queue=queue)
        result = _run(target, [job], s, f"publish_transient-{tag}")
    return {"publish_transient": _throughput(result, s.messages)}


def publish_persistent(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.publish-persistent.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=True)
        job = Publish(queue, s.messages, body_size=s.body_size, persistent=True, window=s.window)
        result = _run(target, [job], s, f"publish_persistent-{tag}")
    return {"publish_persistent": _throughput(result, s.messages)}


def consume(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.consume.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=False)
            client.publish(publish_frames(queue, b"x" * s.body_size), s.messages)
            client.wait_for_count(queue, s.messages)
        job = Consume(queue, s.messages, prefetch=s.prefetch, ack_every=s.ack_every)
        result = _run(target, [job], s, f"consume-{tag}")
    return {"consume": _throughput(result, s.messages)}


def latency(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.latency.{tag}"
    count = max(int(s.latency_rate * s.latency_seconds), 10)
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, durable=False)
        jobs: list[Job] = [
            Consume(
                queue,
                count,
                prefetch=s.prefetch,
                ack_every=s.ack_every,
                subscribe_early=True,
                latency=True,
            ),
        ]
        jobs.append(PacedPublish(queue, count, s.latency_rate, body_size=s.body_size))
        result = _run(target, jobs, s, f"latency-{tag}")
    stamps = result.outcomes[0].latencies_ns
    assert stamps is not None
    warmup = min(int(s.latency_rate / 4), len(stamps) // 10)
    samples = sorted(stamps[warmup:])
    publisher = result.outcomes[1]
    detail: dict[str, float | int | str] = {
        "samples": len(samples),
        "max_ms": samples[-1] / 1e6,
        "mean_ms": sum(samples) / len(samples) / 1e6,
        "sent_rate": publisher.messages / (publisher.finished - publisher.started),
    }
    return {
        key: Measure(
            _percentile(samples, p) / 1e6,
            result.wall,
            result.broker_cpu,
            result.client_cpu,
            detail,
            other_cpu=result.other_cpu,
        )
        for key, p in (("latency_p50", 0.50), ("latency_p99", 0.99), ("latency_p999", 0.999))
    }


def _percentile(ordered: list[int], p: float) -> float:
    """Nearest rank."""
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)]


def fanout(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    return {"fanout": _fanout(target, s, tag, s.fanout_queues, s.messages)}


def fanout_16(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    return {"fanout_16": _fanout(target, s, f"16.{tag}", 16, max(s.messages // 4, 1))}


def _fanout(target: Target, s: Settings, tag: str, width: int, messages: int) -> Measure:
    exchange = f"bench.fanout.{tag}"
    queues = [f"bench.fanout.{tag}.{i}" for i in range(width)]
    with _cleanup(target, queues, (exchange,)):
        with _client(target) as client:
            client.exchange_declare(exchange, "fanout")
            for queue in queues:
                client.declare(queue, durable=False)
                client.bind(queue, exchange)
        jobs: list[Job] = [  # multi: a connection per queue; single: one for all
            ConsumeEach(tuple(queues[i::CONSUMER_PROCESSES]), messages, s.prefetch, s.ack_every)
            for i in range(CONSUMER_PROCESSES)
        ]
        if s.mode == "single":
            jobs = [Consume(queues[0], messages * width, s.prefetch, s.ack_every, also=queues[1:])]
        jobs.append(Publish("", messages, exchange=exchange, body_size=s.body_size))
        result = _run(target, jobs, s, f"fanout{width}-{s.mode}-{tag}")
    return _throughput(result, messages * width)


def stream(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    queue = f"bench.stream.{tag}"
    with _cleanup(target, [queue]):
        with _client(target) as client:
            client.declare(queue, {"x-queue-type": "stream"}, durable=True)
        publish = Publish(
            queue, s.messages, body_size=s.body_size, persistent=True, window=s.window
        )
        published = _run(target, [publish], s, f"stream_publish-{tag}")
        read = Consume(
            queue,
            s.messages,
            prefetch=s.prefetch,
            ack_every=s.ack_every,
            arguments={"x-stream-offset": "first"},
        )
        result = _run(target, [read], s, f"stream_read-{tag}")
    return {
        "stream_publish": _throughput(published, s.messages),
        "stream_read": _throughput(result, s.messages),
    }


def memory_durable(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    return _memory(target, s, tag, durable=True)


def memory_transient(target: Target, s: Settings, tag: str) -> dict[str, Measure]:
    return _memory(target, s, tag, durable=False)


def _memory(target: Target, s: Settings, tag: str, *, durable: bool) -> dict[str, Measure]:
    """RSS growth per queued message on a fresh broker; after the durable backlog, unclean
    recovery."""
    kind = "durable" if durable else "transient"
    queue = f"bench.memory.{kind}"
    out: dict[str, Measure] = {}
    with target.fresh() as broker, _cleanup(broker, [queue]):
        if broker.pid is None:
            raise RuntimeError("the broker's process is unknown: no RSS to read")
        with _client(broker) as client:
            client.declare(queue, durable=durable)
        time.sleep(s.settle)
        before = memory(broker.pid)
        job = Publish(queue, s.queued, body_size=s.body_size, persistent=durable, window=s.window)
        result = _run(broker, [job], s, f"memory_{kind}-{tag}")
        peak = memory(broker.pid)
        after, settled = _settled_memory(broker.pid, s)
        out[f"memory_{kind}"] = Measure(
            (after.rss - before.rss) / s.queued,
            result.wall,
            result.broker_cpu,
            result.client_cpu,
            {
                "queued": s.queued,
                "rss_before": before.rss,
                "rss_after": after.rss,
                "rss_right_after_fill": peak.rss,
                "settle_seconds": settled,
                "anon_per_msg": (after.anon - before.anon) / s.queued,
                "file_per_msg": (after.file - before.file) / s.queued,
                "fill_rate": s.queued / result.wall,
            },
            other_cpu=result.other_cpu,
        )
        if durable and broker.can_restart:
            out["recovery"] = _recovery(broker, queue, s)
    return out


def _settled_memory(pid: int, s: Settings) -> tuple[Memory, float]:
    """RSS once it stops falling (an Erlang VM gives memory back over tens of seconds after a
    burst, as its processes hibernate and its allocators free carriers): sampled every second
    until it fell less than 1% over ``settle_window`` seconds (at most ``settle_max``); the
    sample and the seconds waited."""
    start = time.perf_counter()
    time.sleep(s.settle)
    samples = [(time.perf_counter(), memory(pid))]
    while time.perf_counter() - start < s.settle_max:
        time.sleep(min(1.0, s.settle_window))
        now = time.perf_counter()
        samples.append((now, memory(pid)))
        earlier = [m.rss for t, m in samples if now - t >= s.settle_window]
        if earlier and samples[-1][1].rss > 0.99 * min(earlier):
            break
    return min((m for _t, m in samples), key=lambda m: m.rss), time.perf_counter() - start


def _recovery(broker: Target, queue: str, s: Settings) -> Measure:
    """kill -9, start again on the same data, and time until a passive declare of the queue
    answers with the whole backlog."""
    on_disk = broker.data_bytes()
    broker.crash()
    cpu, start = time.process_time(), time.perf_counter()
    broker.restart()
    deadline, last = start + 1800.0, "no answer"
    while True:
        try:
            with _client(broker) as client:
                count = client.message_count(queue)
            if count >= s.queued:
                break
            last = f"{count} messages"
        except (OSError, ConnectionError, BrokerError) as exc:
            last = repr(exc)
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the queue did not come back with {s.queued} messages: {last}")
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    client_cpu = time.process_time() - cpu
    broker.after_restart()
    gigabytes = s.queued * s.body_size / 1e9
    detail: dict[str, float | int | str] = {
        "seconds": seconds,
        "backlog_bytes": s.queued * s.body_size,
    }
    if on_disk is not None:
        detail["on_disk_bytes"] = on_disk
    # A new process: all its CPU so far went into starting and recovering.
    return Measure(seconds / gigabytes, seconds, cpu_seconds(broker.pid), client_cpu, detail)


WORKLOADS: dict[str, Workload] = {
    "publish-transient": publish_transient,
    "publish-persistent": publish_persistent,
    "consume": consume,
    "latency": latency,
    "fanout": fanout,
    "fanout-16": fanout_16,
    "stream": stream,
    "memory-durable": memory_durable,
    "memory-transient": memory_transient,
}


# The table's rows (``report.ROWS``) each workload fills.
ROWS_OF: dict[str, list[str]] = {
    "publish-transient": ["publish_transient"],
    "publish-persistent": ["publish_persistent"],
    "consume": ["consume"],
    "latency": ["latency_p50", "latency_p99", "latency_p999"],
    "fanout": ["fanout"],
    "fanout-16": ["fanout_16"],
    "stream": ["stream_publish", "stream_read"],
    "memory-durable": ["memory_durable", "recovery"],
    "memory-transient": ["memory_transient"],
}
