"""``cluster status``: the cluster as the broker's node sees it, from ``GET /cluster``;
``cluster elect-leaders``: a preferred leader election now (``POST /cluster/preferred-election``).

``--format table``: a line naming the node asked and the controller, the nodes (NODE AMQP
HTTP INCARNATION CONTROLLER), then the replicated partitions with Kafka's columns (LEADER,
REPLICAS, ISR; ``none`` for an offline partition's leader, as kafka-topics prints it), their
epoch, min ISR, state and whether they are under-replicated, and a count of the offline and
under-replicated ones. ``--format json``: ``/cluster``'s answer as it is. A broker on its own
says so (exit status 0).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import output
from .api import Api

NODE_COLUMNS = ["NODE", "AMQP", "HTTP", "INCARNATION", "CONTROLLER"]
PARTITION_COLUMNS = [
    "VHOST",
    "QUEUE",
    "LEADER",
    "EPOCH",
    "REPLICAS",
    "ISR",
    "MIN-ISR",
    "STATE",
    "UNDER-REPLICATED",
]


def add(subparsers: argparse._SubParsersAction[Any], common: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="the cluster's nodes and partitions")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)
    status = actions.add_parser(
        "status", parents=[common], help="nodes, controller, partitions' leaders and ISRs"
    )
    status.set_defaults(run=cluster_status)
    elect = actions.add_parser(
        "elect-leaders",
        parents=[common],
        help="give each partition back to its preferred replica now (kafka-leader-election "
        "--election-type preferred)",
    )
    elect.set_defaults(run=elect_leaders)


def elect_leaders(args: argparse.Namespace, api: Api) -> int:
    """``POST /cluster/preferred-election``: the partitions led by their preferred replica now,
    and those that are not (its replica is not in sync)."""
    found = api.request("POST", "/cluster/preferred-election")
    if args.format == "json":
        print(json.dumps(found, ensure_ascii=False))
        return 0
    preferred, other = found["preferred"], found["not_preferred"]
    print(f"Led by their preferred replica: {len(preferred)} partition(s)")
    if other:
        print(f"Not led by their preferred replica (not in sync): {', '.join(other)}")
    return 0


def cluster_status(args: argparse.Namespace, api: Api) -> int:
    found = api.get("/cluster")
    if args.format == "json":
        print(json.dumps(found, ensure_ascii=False))
        return 0
    if not found.get("cluster"):
        print("Not a cluster: the broker runs on its own.")
        return 0
    controller = found["controller"]
    print(f"Node: {found['node']}\tController: {controller['node'] if controller else 'none'}")
    print()
    nodes = [
        [n["id"], n["amqp"], n["http"], n["incarnation"], n["controller"]] for n in found["nodes"]
    ]
    output.emit("table", NODE_COLUMNS, nodes)
    partitions = found["partitions"]
    print()
    rows = [
        [
            p["vhost"],
            p["queue"],
            p["leader"] or "none",
            p["epoch"],
            ",".join(p["replicas"]),
            ",".join(p["isr"]) or "-",
            p["min_isr"],
            p["state"],
            p["under_replicated"],
        ]
        for p in partitions
    ]
    output.emit("table", PARTITION_COLUMNS, rows)
    offline = sum(p["state"] == "offline" for p in partitions)
    under = sum(bool(p["under_replicated"]) for p in partitions)
    print(f"\nPartitions: {len(partitions)}\tOffline: {offline}\tUnderReplicated: {under}")
    return 0
