"""The rabbitmqctl-style commands, over the RabbitMQ-compatible management API (``/api``), so
they work against tqbroker and against RabbitMQ alike:

- ``list queues|exchanges|bindings|connections|consumers|vhosts [--columns a,b]``: rabbitmqctl's
  column names and default columns (``list_queues`` shows ``name messages``);
- ``purge QUEUE``, ``delete queue|exchange NAME``, ``close-connection NAME [--reason]``;
- ``export-definitions FILE`` / ``import-definitions FILE`` (``-``: standard output / input);
- ``status``: the node, its listeners, totals and alarms.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from . import output
from .api import Api, CommandError, UsageError, quote

Field = Callable[[dict[str, Any]], Any]


def _at(*path: str) -> Field:
    def get(row: dict[str, Any]) -> Any:
        value: Any = row
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return get


def _names(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(names)


@attrs.frozen
class Kind:
    """A ``list`` target: its API path, default columns, and every column rabbitmqctl has
    (a column is the API's field of that name unless ``fields`` says where it is)."""

    path: str
    per_vhost: bool
    default: tuple[str, ...]
    columns: tuple[str, ...] = attrs.field(converter=_names)
    fields: dict[str, Field] = attrs.field(factory=dict)


KINDS = {
    "queues": Kind(
        "/api/queues",
        True,
        ("name", "messages"),
        [
            "arguments",
            "auto_delete",
            "consumer_capacity",
            "consumer_utilisation",
            "consumers",
            "disk_reads",
            "disk_writes",
            "durable",
            "exclusive",
            "exclusive_consumer_tag",
            "head_message_timestamp",
            "leader",
            "members",
            "memory",
            "message_bytes",
            "message_bytes_persistent",
            "message_bytes_ram",
            "message_bytes_ready",
            "message_bytes_unacknowledged",
            "messages",
            "messages_persistent",
            "messages_ram",
            "messages_ready",
            "messages_ready_ram",
            "messages_unacknowledged",
            "messages_unacknowledged_ram",
            "name",
            "online",
            "policy",
            "state",
            "type",
            "vhost",
            "node",
        ],
        {"leader": _at("node")},
    ),
    "exchanges": Kind(
        "/api/exchanges",
        True,
        ("name", "type"),
        ("arguments", "auto_delete", "durable", "internal", "name", "policy", "type", "vhost"),
    ),
    "bindings": Kind(
        "/api/bindings",
        True,
        (
            "source_name",
            "source_kind",
            "destination_name",
            "destination_kind",
            "routing_key",
            "arguments",
        ),
        (
            "arguments",
            "destination_kind",
            "destination_name",
            "routing_key",
            "source_kind",
            "source_name",
            "vhost",
        ),
        {
            "source_name": _at("source"),
            "source_kind": lambda row: "exchange",
            "destination_name": _at("destination"),
            "destination_kind": _at("destination_type"),
        },
    ),
    "connections": Kind(
        "/api/connections",
        False,
        ("user", "peer_host", "peer_port", "state"),
        [
            "auth_mechanism",
            "channel_max",
            "channels",
            "client_properties",
            "connected_at",
            "frame_max",
            "host",
            "name",
            "node",
            "peer_host",
            "peer_port",
            "port",
            "protocol",
            "recv_cnt",
            "recv_oct",
            "send_cnt",
            "send_oct",
            "send_pend",
            "ssl",
            "state",
            "timeout",
            "user",
            "vhost",
        ],
    ),
    "consumers": Kind(
        "/api/consumers",
        True,
        (
            "queue_name",
            "channel_pid",
            "consumer_tag",
            "ack_required",
            "prefetch_count",
            "active",
            "arguments",
        ),
        [
            "ack_required",
            "active",
            "activity_status",
            "arguments",
            "channel_pid",
            "connection_name",
            "consumer_tag",
            "exclusive",
            "prefetch_count",
            "queue_name",
        ],
        {
            "queue_name": _at("queue", "name"),
            "channel_pid": _at("channel_details", "name"),  # no Erlang pids: the channel's name
            "connection_name": _at("channel_details", "connection_name"),
        },
    ),
    "vhosts": Kind(
        "/api/vhosts",
        False,
        ("name",),
        ("cluster_state", "default_queue_type", "description", "name", "tags", "tracing"),
    ),
}


def add(subparsers: argparse._SubParsersAction[Any], common: Any) -> None:
    listing = subparsers.add_parser(
        "list", parents=[common], help="list queues, exchanges, bindings, connections, ..."
    )
    listing.add_argument("kind", choices=list(KINDS))
    listing.add_argument(
        "--columns",
        help="comma-separated rabbitmqctl column names (default: rabbitmqctl's defaults)",
    )
    listing.set_defaults(run=list_objects)
    purge = subparsers.add_parser("purge", parents=[common], help="purge a queue")
    purge.add_argument("queue")
    purge.set_defaults(run=purge_queue)
    delete = subparsers.add_parser("delete", parents=[common], help="delete a queue or exchange")
    delete.add_argument("kind", choices=["queue", "exchange"])
    delete.add_argument("name")
    delete.add_argument("--if-empty", action="store_true", help="queues: only if empty")
    delete.add_argument("--if-unused", action="store_true", help="only if unused")
    delete.set_defaults(run=delete_object)
    close = subparsers.add_parser(
        "close-connection", parents=[common], help="close a client connection by name"
    )
    close.add_argument("name", help="the connection's name (list connections --columns name)")
    close.add_argument("--reason", default="closed by tqbroker-ctl", help="told to the client")
    close.set_defaults(run=close_connection)
    export = subparsers.add_parser(
        "export-definitions", parents=[common], help="write the definitions (JSON) to FILE"
    )
    export.add_argument("file", help="a file, or - for standard output")
    export.set_defaults(run=export_definitions)
    load = subparsers.add_parser(
        "import-definitions", parents=[common], help="import definitions (JSON) from FILE"
    )
    load.add_argument("file", help="a file, or - for standard input")
    load.set_defaults(run=import_definitions)
    status = subparsers.add_parser("status", parents=[common], help="the broker's status")
    status.set_defaults(run=show_status)


def list_objects(args: argparse.Namespace, api: Api) -> int:
    kind = KINDS[args.kind]
    columns = kind.default
    if args.columns:
        columns = tuple(c.strip() for c in args.columns.split(",") if c.strip())
        unknown = [c for c in columns if c not in kind.columns]
        if unknown or not columns:
            raise UsageError(
                f"--columns: {', '.join(unknown) or 'none given'}: the columns of {args.kind} "
                f"are {', '.join(sorted(kind.columns))}"
            )
    path = kind.path + (f"/{quote(api.vhost)}" if kind.per_vhost else "")
    try:
        rows = api.get(path)
    except CommandError as exc:
        if kind.per_vhost and str(exc).startswith("404"):
            raise CommandError(f"404: no vhost '{api.vhost}'") from None
        raise
    if not isinstance(rows, list):
        raise CommandError(f"{path}: expected a list")
    fields = [kind.fields.get(c, _at(c)) for c in columns]
    output.emit(args.format, columns, [[f(row) for f in fields] for row in rows])
    return 0


def _queue_path(api: Api, name: str) -> str:
    return f"/api/queues/{quote(api.vhost)}/{quote(name)}"


def purge_queue(args: argparse.Namespace, api: Api) -> int:
    api.request("DELETE", _queue_path(api, args.queue) + "/contents")
    print(f"purged queue '{args.queue}' in vhost '{api.vhost}'")
    return 0


def delete_object(args: argparse.Namespace, api: Api) -> int:
    query = {}
    if args.if_empty:
        if args.kind != "queue":
            raise UsageError("--if-empty applies to queues only")
        query["if-empty"] = "true"
    if args.if_unused:
        query["if-unused"] = "true"
    plural = "queues" if args.kind == "queue" else "exchanges"
    path = f"/api/{plural}/{quote(api.vhost)}/{quote(args.name)}"
    api.request("DELETE", path, query=query or None)
    print(f"deleted {args.kind} '{args.name}' in vhost '{api.vhost}'")
    return 0


def close_connection(args: argparse.Namespace, api: Api) -> int:
    api.request("DELETE", f"/api/connections/{quote(args.name)}", headers={"X-Reason": args.reason})
    print(f"closed connection '{args.name}'")
    return 0


def _definitions_path(args: argparse.Namespace, api: Api) -> str:
    return "/api/definitions" + (f"/{quote(api.vhost)}" if args.vhost_given else "")


def export_definitions(args: argparse.Namespace, api: Api) -> int:
    definitions = api.get(_definitions_path(args, api))
    text = json.dumps(definitions, indent=2, ensure_ascii=False) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(args.file).write_text(text)
    except OSError as exc:
        raise CommandError(f"cannot write {args.file}: {exc.strerror or exc}") from None
    print(f"exported definitions to {args.file}")
    return 0


def import_definitions(args: argparse.Namespace, api: Api) -> int:
    try:
        raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise CommandError(f"cannot read {args.file}: {reason}") from None
    try:
        definitions = json.loads(raw)
    except ValueError as exc:
        raise CommandError(f"{args.file} is not JSON: {exc}") from None
    if not isinstance(definitions, dict):
        raise CommandError(f"{args.file}: definitions are a JSON object")
    api.request("POST", _definitions_path(args, api), definitions)
    print(f"imported definitions from {args.file}")
    return 0


def show_status(args: argparse.Namespace, api: Api) -> int:
    overview = api.get("/api/overview")
    try:
        api.get("/api/health/checks/alarms")
        alarms = "none"
    except CommandError as exc:
        alarms = str(exc).partition(": ")[2] or str(exc)
    if args.format == "json":
        print(json.dumps({**overview, "alarms": alarms}, ensure_ascii=False))
        return 0
    product = overview.get("product_name", "RabbitMQ")
    version = overview.get("product_version") or overview.get("rabbitmq_version", "?")
    totals = overview.get("object_totals", {})
    queued = overview.get("queue_totals", {})
    listeners = ", ".join(
        f"{entry.get('protocol')} {entry.get('ip_address')}:{entry.get('port')}"
        for entry in overview.get("listeners", [])
    )
    lines = [
        f"Node: {overview.get('node', '?')}",
        f"Product: {product} {version}",
        f"Listeners: {listeners or '-'}",
        "Totals: "
        + ", ".join(
            f"{totals.get(k, 0)} {k}"
            for k in ("connections", "channels", "queues", "exchanges", "consumers")
        ),
        f"Messages: {queued.get('messages', 0)} ({queued.get('messages_ready', 0)} ready, "
        f"{queued.get('messages_unacknowledged', 0)} unacknowledged)",
        f"Alarms: {alarms}",
    ]
    print("\n".join(lines))
    return 0
