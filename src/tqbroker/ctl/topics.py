"""``topics create|list|describe|delete|alter``: kafka-topics over the broker's topic routes.

- ``create TOPIC --partitions N [--config retention.ms=86400000 ...] [--arg x-max-age=7D ...]``:
  a partitioned stream, idempotently, with Kafka topic configs and stream arguments (the
  broker refuses a name that is neither: a Kafka config given as ``--arg`` too);
- ``list``: the topics (``--format table``: TOPIC PARTITIONS; Kafka's ``--list`` prints names);
- ``describe TOPIC``: a line with the partition count, arguments and groups, then per
  partition its stream queue, log start and end offsets, messages, segments and bytes (and in
  a cluster Kafka's LEADER, REPLICAS and ISR);
- ``delete TOPIC``: its partitions and exchange;
- ``alter TOPIC [--partitions N] [--config NAME=VALUE ...] [--delete-config NAME ...]``: grow
  (never shrink, as Kafka), set configs or put them back to their defaults.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import output
from .api import Api, UsageError, quote


def add(subparsers: argparse._SubParsersAction[Any], common: Any) -> None:
    topics = subparsers.add_parser("topics", help="list, describe, create, delete, alter topics")
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=[common], help="declare a partitioned stream")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a stream argument, e.g. x-max-age=7D (repeatable; integers stay integers)",
    )
    _config_option(create)
    create.set_defaults(run=create_topic)
    listing = actions.add_parser("list", parents=[common], help="the vhost's topics")
    listing.set_defaults(run=list_topics)
    describe = actions.add_parser("describe", parents=[common], help="a topic's partitions")
    describe.add_argument("topic")
    describe.set_defaults(run=describe_topic)
    delete = actions.add_parser("delete", parents=[common], help="delete a topic")
    delete.add_argument("topic")
    delete.set_defaults(run=delete_topic)
    alter = actions.add_parser(
        "alter", parents=[common], help="grow a topic's partitions, alter its configs"
    )
    alter.add_argument("topic")
    alter.add_argument("--partitions", type=int, help="the new count (larger)")
    _config_option(alter)
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="NAME",
        help="put a Kafka topic config back to its default (repeatable)",
    )
    alter.set_defaults(run=alter_topic)


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Kafka topic config, e.g. retention.ms=86400000, cleanup.policy=compact "
        "(repeatable: retention.ms, retention.bytes, segment.bytes, cleanup.policy, "
        "max.message.bytes, compression.type)",
    )


def _configs(items: list[str]) -> dict[str, str | None]:
    configs: dict[str, str | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--config wants NAME=VALUE (got {item!r})")
        configs[name] = value
    return configs


def _path(topic: str) -> str:
    if "/" in topic or not topic:  # the API's paths could not name it
        raise UsageError(f"a topic name is non-empty and has no '/' (got {topic!r})")
    return f"/topics/{quote(topic)}"


def create_topic(args: argparse.Namespace, api: Api) -> int:
    arguments: dict[str, Any] = {}
    for item in args.arg:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--arg wants NAME=VALUE (got {item!r})")
        arguments[name] = int(value) if value.lstrip("-").isdigit() else value
    body = {"partitions": args.partitions, "arguments": arguments, "configs": _configs(args.config)}
    reply = api.topics("PUT", _path(args.topic), body)
    state = "created" if reply["created"] else "exists"
    print(f"topic {args.topic}: {reply['partitions']} partition(s), {state}")
    return 0


def list_topics(args: argparse.Namespace, api: Api) -> int:
    found = api.topics("GET", "/topics")
    rows = [[t["topic"], t["partitions"]] for t in found]
    output.emit(args.format, ["TOPIC", "PARTITIONS"], rows)
    return 0


def describe_topic(args: argparse.Namespace, api: Api) -> int:
    found = api.topics("GET", _path(args.topic))
    if args.format == "json":
        print(json.dumps(found, ensure_ascii=False))
        return 0
    arguments = ",".join(f"{k}={output.cell(v)}" for k, v in found["arguments"].items())
    print(
        f"Topic: {found['topic']}\tPartitionCount: {len(found['partitions'])}\t"
        f"Configs: {arguments}\tGroups: {','.join(found['groups']) or '-'}"
    )
    columns = [
        "PARTITION",
        "QUEUE",
        "LOG-START-OFFSET",
        "LOG-END-OFFSET",
        "MESSAGES",
        "SEGMENTS",
        "BYTES",
    ]
    keys = ["partition", "queue", "log_start_offset", "log_end_offset", "messages", "segments"]
    rows = [[p[k] for k in [*keys, "bytes"]] for p in found["partitions"]]
    if any("replicas" in p for p in found["partitions"]):  # in a cluster: Kafka's columns
        columns += ["LEADER", "REPLICAS", "ISR"]
        for row, p in zip(rows, found["partitions"], strict=True):
            row += _replication(p)
    output.emit("table", columns, rows)
    return 0


def _replication(partition: dict[str, Any]) -> list[str]:
    """A replicated partition's Leader, Replicas and Isr as kafka-topics prints them
    (``none`` for no leader; ``-`` for a partition the cluster does not replicate)."""
    if "replicas" not in partition:
        return ["-", "-", "-"]
    return [
        partition["leader"] or "none",
        ",".join(partition["replicas"]),
        ",".join(partition["isr"]) or "-",
    ]


def delete_topic(args: argparse.Namespace, api: Api) -> int:
    reply = api.topics("DELETE", _path(args.topic))
    print(f"deleted topic {args.topic} ({reply['deleted_partitions']} partition(s))")
    return 0


def alter_topic(args: argparse.Namespace, api: Api) -> int:
    body: dict[str, Any] = {}
    configs = _configs(args.config)
    configs.update(dict.fromkeys(args.delete_config))
    if configs:
        body["configs"] = configs
    if args.partitions is not None:
        body["partitions"] = args.partitions
    if not body:
        raise UsageError("alter wants --partitions, --config or --delete-config")
    reply = api.topics("PATCH", _path(args.topic), body)
    if "previous_partitions" in reply:
        print(
            f"topic {args.topic}: {reply['previous_partitions']} -> {reply['partitions']} "
            "partition(s)"
        )
    if configs:
        shown = ",".join(f"{name}={reply['configs'][name]}" for name in configs)
        print(f"topic {args.topic}: configs {shown}")
    return 0
