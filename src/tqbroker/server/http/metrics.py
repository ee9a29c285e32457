"""Prometheus metrics: the broker's state and counters as metric families, read at scrape time,
named as RabbitMQ's ``rabbitmq_prometheus`` plugin names them where the concept matches, ours
under ``tqbroker_`` for what it lacks.

Responsibilities:
- ``walk``: one pass over the broker (vhosts, queues, connections and channels through their
  stats, flushers, streams) building the node-wide families of ``/metrics`` (queue figures
  summed); a generator, so that a caller can give way between queues (``collect_async``) or
  not (``BrokerCollector``, a prometheus-client ``Collector``);
- ``per_queue``: the queue families per queue (``vhost`` and ``queue`` labels) of
  ``/metrics/per-object`` and ``/metrics/detailed`` (``rabbitmq_detailed_`` names), in pieces.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import attrs
import prometheus_client
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)

from ..._version import __version__
from ...broker.classic import ClassicQueue
from ...broker.pacing import Pacer
from ...broker.queue import Queue
from ...broker.stats import COUNTERS, IO_COUNTERS, StatsTotal
from ...broker.streams.service import Partition, partition_of
from .metrics_names import (
    BY_QUEUE_TYPE,
    CHANNEL_COUNTERS,
    CONNECTION_COUNTERS,
    QUEUE_FAMILIES,
    QUEUE_TYPES,
    QUORUM,
)

if TYPE_CHECKING:
    from ...broker.broker import Broker

_IDX = {name: index for index, name in enumerate(COUNTERS)}
PIECE = 500  # queues per rendered piece of a per-queue family
QUEUE_NAMES = [name for name, _help, _counter in QUEUE_FAMILIES]


def queue_depth(queue: Queue) -> tuple[int, int, int]:
    """(ready, unacked, ready bytes) of a queue."""
    if isinstance(queue, ClassicQueue):
        store = queue.store
        return store.ready_count, store.unacked_count, store.ready_bytes
    return queue.message_count, sum(c.unacked for c in queue.consumers), 0


def walk(broker: Broker, out: list[Metric], *, per_object: bool = False) -> Iterator[None]:
    """Append the node-wide families to ``out`` (with the queue figures summed, unless
    ``per_object``: then ``per_queue`` gives them), yielding after each queue (``collect_async``
    gives way there)."""
    seen = _Seen()
    yield from _queues(broker, out, seen, summed=not per_object)
    _node(broker, out, seen)
    _totals(broker, out, seen)
    _storage(broker, out)
    _streams(out, seen)


@attrs.define
class _Seen:
    """What the pass over the queues found for the node-wide families."""

    queues: int = 0
    consumers: int = 0
    counts: dict[str, list[tuple[int, ...]]] = attrs.Factory(dict)  # by RabbitMQ's queue_type
    streams: list[tuple[str, Queue, Partition]] = attrs.Factory(list)


def queue_values(queue: Queue) -> tuple[int, ...]:
    """A queue's figures, in ``QUEUE_FAMILIES`` order."""
    ready, unacked, ready_bytes = queue_depth(queue)
    return ready, unacked, ready + unacked, len(queue.consumers), ready_bytes, queue.stats.publish


def _queues(broker: Broker, out: list[Metric], seen: _Seen, *, summed: bool) -> Iterator[None]:
    totals = [0] * len(QUEUE_FAMILIES)
    for vhost in list(broker.vhosts.values()):
        for queue in list(vhost.queues.values()):
            if queue.deleted:
                continue
            values = queue_values(queue)
            seen.queues += 1
            seen.consumers += values[3]
            kind = QUEUE_TYPES["classic"]
            partition = partition_of(queue)
            if partition is not None:
                kind = QUEUE_TYPES["stream"]
                seen.streams.append((vhost.name, queue, partition))
            seen.counts.setdefault(kind, []).append(queue.stats.counts())
            for index, value in enumerate(values):
                totals[index] += value
            yield None
    if summed:
        for (name, help_, counter), total in zip(QUEUE_FAMILIES, totals, strict=True):
            family = CounterMetricFamily if counter else GaugeMetricFamily
            out.append(family(f"rabbitmq_{name}", help_, value=total))


def per_queue(
    broker: Broker, names: Iterable[str], prefix: str, vhosts: Iterable[str] | None = None
) -> Iterator[tuple[Metric, bool]]:
    """The queue families ``names`` (of ``QUEUE_FAMILIES``) per queue (``vhost``, ``queue``
    labels), family after family, each in pieces of ``PIECE`` queues: ``(piece, first)``.
    Rendered piece by piece (nothing piles up for the garbage collector to walk: a scrape of
    10k queues would otherwise set off full collections)."""
    only = set(vhosts) if vhosts is not None else None
    queues = [
        (vhost.name, queue)
        for vhost in list(broker.vhosts.values())
        if only is None or vhost.name in only
        for queue in list(vhost.queues.values())
    ]
    index_of = {name: index for index, (name, _h, _c) in enumerate(QUEUE_FAMILIES)}
    for name in names:
        index = index_of[name]
        _name, help_, counter = QUEUE_FAMILIES[index]
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        for start in range(0, max(len(queues), 1), PIECE):
            piece = kind(prefix + name, help_, labels=["vhost", "queue"])
            for vhost, queue in queues[start : start + PIECE]:
                if not queue.deleted:
                    piece.add_metric([vhost, queue.name], queue_values(queue)[index])
            yield piece, start == 0


def _node(broker: Broker, out: list[Metric], seen: _Seen) -> None:
    connections = [c for v in broker.vhosts.values() for c in v.stats.parts]
    channels = [ch for c in connections if isinstance(c, StatsTotal) for ch in c.parts]
    gauges = (
        ("rabbitmq_connections", "Connections currently open", len(connections)),
        ("rabbitmq_channels", "Channels currently open", len(channels)),
        ("rabbitmq_queues", "Queues available", seen.queues),
        ("rabbitmq_consumers", "Consumers currently connected", seen.consumers),
        (
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            broker.memory_monitor.limit,
        ),
    )
    for name, help_, value in gauges:
        out.append(GaugeMetricFamily(name, help_, value=value))
    for name, help_, field in CHANNEL_COUNTERS:
        index = _IDX[field]
        out.append(
            CounterMetricFamily(
                f"rabbitmq_channel_{name}", help_, value=sum(ch.counts()[index] for ch in channels)
            )
        )
    for name, help_, field in CONNECTION_COUNTERS:
        index = len(COUNTERS) + IO_COUNTERS.index(field)
        out.append(
            CounterMetricFamily(
                f"rabbitmq_connection_{name}",
                help_,
                value=sum(c.counts()[index] for c in connections if len(c.FIELDS) > index),
            )
        )
    active = broker.alarms.active
    for name, help_, resource in (
        ("memory_used_watermark", "is 1 if VM memory watermark alarm is in effect", "memory"),
        (
            "free_disk_space_watermark",
            "is 1 if free disk space watermark alarm is in effect",
            "disk",
        ),
        ("file_descriptor_limit", "is 1 if file descriptor limit alarm is in effect", "fd"),
    ):
        out.append(
            UnknownMetricFamily(f"rabbitmq_alarms_{name}", help_, value=int(resource in active))
        )
    build = UnknownMetricFamily(
        "rabbitmq_build_info",
        "RabbitMQ & Erlang/OTP version info",
        labels=[
            "rabbitmq_version",
            "prometheus_plugin_version",
            "prometheus_client_version",
            "tqbroker_version",
            "python_version",
        ],
    )
    build.add_metric(
        [__version__, __version__, _client_version(), __version__, platform.python_version()], 1
    )
    identity = UnknownMetricFamily(
        "rabbitmq_identity_info",
        "RabbitMQ node & cluster identity info",
        labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"],
    )
    identity.add_metric([broker.node_name, broker.node_name, f"tqbroker-{broker.node_name}"], 1)
    out += [build, identity]


def _totals(broker: Broker, out: list[Metric], seen: _Seen) -> None:
    """``rabbitmq_global_*``: the node's counters since it started (never going back)."""
    node = broker.stats.counts()

    def counter(name: str, help_: str, value: int) -> None:
        family = CounterMetricFamily(f"rabbitmq_global_{name}", help_, labels=["protocol"])
        family.add_metric(["amqp091"], value)
        out.append(family)

    publish, dropped, returned = (
        node[_IDX[n]] for n in ("publish", "drop_unroutable", "return_unroutable")
    )
    counter("messages_received", "Total number of messages received from publishers", publish)
    counter(
        "messages_routed",
        "Total number of messages routed to queues or streams",
        publish - dropped - returned,
    )
    counter(
        "messages_unroutable_dropped",
        "Total number of messages published as non-mandatory "
        "into an exchange and dropped as unroutable",
        dropped,
    )
    counter(
        "messages_unroutable_returned",
        "Total number of messages published as mandatory into "
        "an exchange and returned to the publisher as unroutable",
        returned,
    )
    counter(
        "messages_confirmed",
        "Total number of messages confirmed to publishers",
        node[_IDX["confirm"]],
    )
    rows = seen.counts
    for vhost in broker.vhosts.values():  # deleted queues' counts stay in the totals
        for kind, stats in vhost.deleted_queue_stats.items():
            rows.setdefault(QUEUE_TYPES[kind], []).append(stats.counts())
    zeros = (0,) * len(COUNTERS)
    by_type = {
        kind: [sum(column) for column in zip(zeros, *rows.get(kind, ()), strict=True)]
        for kind in (*QUEUE_TYPES.values(), QUORUM)
    }
    consumers = GaugeMetricFamily(
        "rabbitmq_global_consumers", "Current number of consumers", labels=["protocol"]
    )
    consumers.add_metric(["amqp091"], seen.consumers)
    out.append(consumers)
    for name, help_, fields in BY_QUEUE_TYPE:
        family = CounterMetricFamily(
            f"rabbitmq_global_{name}", help_, labels=["protocol", "queue_type"]
        )
        for kind in (QUEUE_TYPES["classic"], QUORUM, QUEUE_TYPES["stream"]):
            family.add_metric(["amqp091", kind], sum(by_type[kind][_IDX[f]] for f in fields))
        out.append(family)


def _storage(broker: Broker, out: list[Metric]) -> None:
    """Ours: flush (fsync) latency and group-commit batch sizes per durable backend, backend
    health, the recovery time."""
    seconds = HistogramMetricFamily(
        "tqbroker_fsync_seconds",
        "Time a durable backend's flush (its fsyncs) took",
        labels=["backend"],
    )
    batches = HistogramMetricFamily(
        "tqbroker_group_commit_batch_size",
        "Requests (publishes awaiting confirms, deletes...) one flush made durable",
        labels=["backend"],
    )
    healthy = GaugeMetricFamily(
        "tqbroker_backend_healthy",
        "1 while a storage backend can write, 0 once it cannot",
        labels=["backend"],
    )
    for name, backend in sorted(broker.backends.items()):
        healthy.add_metric([name], int(bool(getattr(backend, "healthy", True))))
    for name, flusher in sorted(broker.flushers.items()):
        seconds.add_metric([name], flusher.flush_seconds.cumulative(), flusher.flush_seconds.sum)
        batches.add_metric([name], flusher.batch_sizes.cumulative(), flusher.batch_sizes.sum)
    recovery = GaugeMetricFamily(
        "tqbroker_recovery_seconds",
        "Seconds the start took to open the stores and restore the definitions",
        value=broker.recovery_seconds if broker.recovery_seconds is not None else float("nan"),
    )
    out += [seconds, batches, healthy, recovery]


def _streams(out: list[Metric], seen: _Seen) -> None:
    """Ours: each stream's (a topic partition's) first and log-end offsets, and each consumer
    group's committed offset and lag on it."""
    labels = ["vhost", "queue"]
    first = GaugeMetricFamily(
        "tqbroker_stream_first_offset",
        "First offset a stream (topic partition) holds",
        labels=labels,
    )
    end = GaugeMetricFamily(
        "tqbroker_stream_log_end_offset",
        "Next offset a stream (topic partition) writes",
        labels=labels,
    )
    committed = GaugeMetricFamily(
        "tqbroker_stream_group_committed_offset",
        "A consumer group's committed offset on a stream",
        labels=[*labels, "group"],
    )
    lag = GaugeMetricFamily(
        "tqbroker_stream_group_lag",
        "Records of a stream a consumer group has not committed yet",
        labels=[*labels, "group"],
    )
    for vhost, queue, partition in seen.streams:
        if queue.deleted:
            continue
        key = [vhost, queue.name]
        log_end = partition.log_end_offset
        first.add_metric(key, partition.log_start_offset)
        end.add_metric(key, log_end)
        for group, offset in sorted(partition.group_offsets.items()):
            committed.add_metric([*key, group], offset)
            lag.add_metric([*key, group], max(0, log_end - offset))
    out += [first, end, committed, lag]


def _client_version() -> str:
    try:
        from importlib.metadata import version

        return version("prometheus-client")
    except Exception:  # not installed as a distribution
        return ""


class BrokerCollector(prometheus_client.registry.Collector):
    """A prometheus-client collector reading the broker when collected (in one go: the HTTP
    routes use ``collect_async``, which gives way between queues)."""

    def __init__(self, broker: Broker, *, per_object: bool = False) -> None:
        self.broker = broker
        self.per_object = per_object

    def collect(self) -> Iterable[Metric]:
        out: list[Metric] = []
        if self.per_object:
            for piece, first in per_queue(self.broker, QUEUE_NAMES, "rabbitmq_"):
                if first:
                    out.append(piece)
                else:
                    out[-1].samples += piece.samples
        for _ in walk(self.broker, out, per_object=self.per_object):
            pass
        return out


async def collect_async(broker: Broker, *, per_object: bool = False) -> list[Metric]:
    """``walk`` giving way to the other tasks every few milliseconds (10k queues)."""
    out: list[Metric] = []
    pacer = Pacer()
    for _ in walk(broker, out, per_object=per_object):
        await pacer.step()
    return out
