"""Prometheus families of a cluster node's replicated partitions (``metrics_routes.py`` adds
them to ``/metrics`` and ``/metrics/per-object`` in a cluster), named in tqbroker's
``tqbroker_stream_*`` style after Kafka's per-partition gauges.

As Kafka's ``kafka.cluster:type=Partition`` gauges (``ReplicasCount``, ``InSyncReplicasCount``,
``UnderReplicated``), a partition is reported by its leader alone, so summing the cluster's
scrapes counts each partition once:
- ``tqbroker_stream_replicas``, ``tqbroker_stream_in_sync_replicas`` (``vhost``, ``queue``):
  the replica list's size and the leader's ISR's;
- ``tqbroker_stream_under_replicated``: 1 while the ISR is smaller than the replica list;
- ``tqbroker_stream_follower_lag`` (``vhost``, ``queue``, ``follower``): the leader's log end
  offset minus the offset the follower last fetched from (its log end), for each follower heard
  from at this epoch (Kafka's replica lag in messages).
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from ...cluster.leader import LeaderReplica
from ...cluster.node import ClusterNode


def replication_families(node: ClusterNode) -> list[Metric]:
    """The families of the partitions ``node`` leads."""
    labels = ["vhost", "queue"]
    replicas = GaugeMetricFamily(
        "tqbroker_stream_replicas",
        "Replicas a replicated stream (topic partition) has, on its leader",
        labels=labels,
    )
    in_sync = GaugeMetricFamily(
        "tqbroker_stream_in_sync_replicas",
        "Replicas of a replicated stream in its leader's in-sync replica set",
        labels=labels,
    )
    under = GaugeMetricFamily(
        "tqbroker_stream_under_replicated",
        "1 while a replicated stream's in-sync replicas are fewer than its replicas",
        labels=labels,
    )
    lag = GaugeMetricFamily(
        "tqbroker_stream_follower_lag",
        "Messages of a replicated stream's leader a follower has not fetched yet",
        labels=[*labels, "follower"],
    )
    for (vhost, queue), held in sorted(node.roles.held.items()):
        role = held.role
        if not isinstance(role, LeaderReplica):
            continue
        found = node.view.partitions.get((vhost, queue))
        count = len(found[0].replicas) if found is not None else len(role.isr)
        key = [vhost, queue]
        replicas.add_metric(key, count)
        in_sync.add_metric(key, len(role.isr))
        under.add_metric(key, int(len(role.isr) < count))
        log_end = held.partition.log_end_offset
        for follower, progress in sorted(role.followers.items()):
            lag.add_metric([*key, follower], max(0, log_end - progress.log_end))
    return [replicas, in_sync, under, lag]
