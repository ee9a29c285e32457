"""``groups list|describe|reset-offsets``: kafka-consumer-groups over the broker's topic routes.

- ``list``: GROUP TOPIC STATE MEMBERS (``Stable`` with members, ``Empty`` with offsets only);
- ``describe --group G [--topic T]``: kafka-consumer-groups' columns, GROUP TOPIC PARTITION
  CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID (the consumer tag, the member's
  address and connection name; ``-`` where nobody reads);
- ``reset-offsets --group G --topic T[:P,P] --to-earliest|--to-latest|--to-offset N|
  --to-datetime T [--dry-run|--execute]``: as Kafka, nothing changes without ``--execute``
  (a warning says so), and the broker refuses while the group has members.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from .. import clock
from . import output
from .api import Api, CommandError, UsageError, quote


def add(subparsers: argparse._SubParsersAction[Any], common: Any) -> None:
    groups = subparsers.add_parser("groups", help="list, describe, reset consumer groups")
    actions = groups.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[common], help="the vhost's consumer groups")
    listing.set_defaults(run=list_groups)
    describe = actions.add_parser(
        "describe", parents=[common], help="a group's offsets, lag and members"
    )
    describe.add_argument("--group", required=True)
    describe.add_argument("--topic", help="only this topic (default: every topic it reads)")
    describe.set_defaults(run=describe_group)
    reset = actions.add_parser(
        "reset-offsets", parents=[common], help="move an inactive group's offsets"
    )
    reset.add_argument("--group", required=True)
    reset.add_argument("--topic", required=True, help="TOPIC, or TOPIC:P,P for some partitions")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument("--to-offset", type=int, metavar="N")
    to.add_argument("--to-datetime", metavar="TIME", help="ISO-8601, UTC unless it says")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="show the new offsets (default)")
    mode.add_argument("--execute", action="store_true", help="write the new offsets")
    reset.set_defaults(run=reset_offsets)


def list_groups(args: argparse.Namespace, api: Api) -> int:
    found = api.topics("GET", "/groups")
    rows = [[g["group"], g["topic"], g["state"], g["members"]] for g in found]
    output.emit(args.format, ["GROUP", "TOPIC", "STATE", "MEMBERS"], rows)
    return 0


DESCRIBE_COLUMNS = [
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
]


def describe_group(args: argparse.Namespace, api: Api) -> int:
    if args.topic:
        topics = [args.topic]
    else:
        topics = [g["topic"] for g in api.topics("GET", "/groups") if g["group"] == args.group]
        if not topics:
            raise CommandError(f"Consumer group '{args.group}' does not exist.")
    rows = []
    stable = False
    for topic in topics:
        found = api.topics("GET", f"/topics/{quote(topic)}/groups/{quote(args.group)}")
        stable = stable or found.get("state") == "Stable"
        for p in found["partitions"]:
            rows.append(
                [
                    args.group,
                    topic,
                    p["partition"],
                    p["committed"],
                    p["latest"],
                    p["lag"],
                    p["reader"],
                    p.get("host"),
                    p.get("connection"),
                ]
            )
    if not stable and args.format == "table":
        print(f"Consumer group '{args.group}' has no active members.\n")
    output.emit(args.format, DESCRIBE_COLUMNS, rows)
    return 0


def _target(args: argparse.Namespace) -> dict[str, Any]:
    if args.to_earliest:
        return {"to": "earliest"}
    if args.to_latest:
        return {"to": "latest"}
    if args.to_offset is not None:
        return {"to": "offset", "value": args.to_offset}
    moment = clock.parse_iso_time(args.to_datetime)
    if moment is None:
        raise UsageError(f"--to-datetime wants an ISO-8601 time (got {args.to_datetime!r})")
    return {"to": "datetime", "value": int(moment.timestamp() * 1000)}


def reset_offsets(args: argparse.Namespace, api: Api) -> int:
    body = _target(args)
    topic = args.topic
    chosen = re.fullmatch(r"(.+):([0-9]+(?:,[0-9]+)*)", topic)
    if chosen is not None:  # Kafka's TOPIC:P,P
        topic = chosen[1]
        body["partitions"] = [int(p) for p in chosen[2].split(",")]
    if not (args.dry_run or args.execute):
        print(
            "WARN: No action will be performed as the --execute option is missing. "
            "Add --dry-run to say so, or --execute to reset.",
            file=sys.stderr,
        )
    body["dry_run"] = not args.execute
    path = f"/topics/{quote(topic)}/groups/{quote(args.group)}/offsets"
    reply = api.topics("POST", path, body)
    if args.format == "json":
        print(json.dumps(reply, ensure_ascii=False))
        return 0
    rows = [[args.group, topic, p["partition"], p["offset"]] for p in reply["partitions"]]
    output.emit("table", ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], rows)
    return 0
