"""Command-line tools that talk to a running broker, as kcat and kafka-topics are for Kafka:

- ``create-topic TOPIC --partitions N``: declare a partitioned stream in one step (HTTP API);
- ``produce TOPIC [--key K]``: each line of standard input becomes a message (HTTP API, which
  confirms once durable; ``--verbose`` prints where each landed);
- ``consume TOPIC --from first|last|next|OFFSET|ISO-TIME [-n N] [--group G]``: print messages
  as they come (AMQP: a consumer on every partition, acking what it printed; with ``--group``
  the partitions are shared with the group's other members and its committed offsets are
  where a restart resumes).

Each returns the process exit status; problems are reported on standard error in one line.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

from . import clock
from .client import Cancelled, Client, ClientError, Delivery
from .protocol.codec import FieldTable, FieldValue

BATCH = 500  # lines per HTTP request when producing


class CommandError(Exception):
    """A problem to report in one line (exit status 1)."""


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--http", default="http://127.0.0.1:15672", help="the broker's HTTP API"
        )
        parser.add_argument("--vhost", default="/", help="virtual host (/)")
        parser.add_argument(
            "--user", default="guest:guest", help="USER:PASSWORD for the HTTP API (guest:guest)"
        )

    create = subparsers.add_parser("create-topic", help="declare a partitioned stream")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a stream argument, e.g. x-max-age=7D (repeatable; integers stay integers)",
    )
    common(create)
    create.set_defaults(command=create_topic)

    produce_parser = subparsers.add_parser("produce", help="publish lines of stdin to a topic")
    produce_parser.add_argument("topic")
    produce_parser.add_argument("--key", default="", help="the key (partitioning, compaction)")
    produce_parser.add_argument(
        "-v", "--verbose", action="store_true", help="print partition and offset of each"
    )
    common(produce_parser)
    produce_parser.set_defaults(command=produce)

    consume_parser = subparsers.add_parser("consume", help="print a topic's messages")
    consume_parser.add_argument("topic")
    consume_parser.add_argument(
        "--from",
        dest="start",
        default="next",
        help="first, last, next (default), an offset, or an ISO-8601 time",
    )
    consume_parser.add_argument("-n", type=int, help="stop after N messages")
    consume_parser.add_argument("--group", help="consume as a member of this consumer group")
    consume_parser.add_argument(
        "--idle", type=float, help="stop after this many seconds without a message"
    )
    consume_parser.add_argument(
        "--format", choices=["value", "json"], default="value", help="value (default) or json"
    )
    consume_parser.add_argument(
        "--url", default="amqp://guest:guest@127.0.0.1:5672/", help="the broker's AMQP URL"
    )
    common(consume_parser)
    consume_parser.set_defaults(command=consume)


def run_command(args: argparse.Namespace) -> int:
    try:
        return int(args.command(args))
    except CommandError as exc:
        print(f"tqbroker {args.command.__name__.replace('_', '-')}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# -- create-topic ------------------------------------------------------------------------------


def create_topic(args: argparse.Namespace) -> int:
    arguments: dict[str, Any] = {}
    for item in args.arg:
        name, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--arg wants NAME=VALUE (got {item!r})")
        arguments[name] = int(value) if value.lstrip("-").isdigit() else value
    reply = _http(
        args,
        "PUT",
        f"/topics/{_quote(args.topic)}",
        {"partitions": args.partitions, "arguments": arguments},
    )
    state = "created" if reply["created"] else "exists"
    print(f"topic {args.topic}: {reply['partitions']} partition(s), {state}")
    return 0


# -- produce -------------------------------------------------------------------------------------


def produce(args: argparse.Namespace) -> int:
    for batch in _batches(sys.stdin.buffer, BATCH):
        records = [_record(line, args.key) for line in batch]
        reply = _http(args, "POST", f"/topics/{_quote(args.topic)}/messages", {"records": records})
        if args.verbose:
            for landed in reply["offsets"]:
                print(f"partition {landed['partition']} offset {landed['offset']}")
    return 0


def _record(line: bytes, key: str) -> dict[str, str]:
    """A line as the HTTP API takes it: text, or base64 if it is not UTF-8 (bytes pass as
    they are)."""
    try:
        return {"value": line.decode(), "key": key}
    except UnicodeDecodeError:
        return {"value": base64.b64encode(line).decode(), "encoding": "base64", "key": key}


def _batches(lines: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in lines:
        batch.append(line.rstrip(b"\r\n"))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# -- consume -------------------------------------------------------------------------------------


def consume(args: argparse.Namespace) -> int:
    start = parse_start(args.start)
    partitions = _http(args, "GET", f"/topics/{_quote(args.topic)}/offsets")["partitions"]
    arguments: FieldTable = {"x-stream-offset": start}
    if args.group:
        arguments["x-stream-group"] = args.group
    url = args.url if args.vhost == "/" else args.url.rstrip("/") + "/" + _quote(args.vhost)
    try:
        with Client(url) as client:
            client.qos(100)
            queues: dict[str, tuple[int, str]] = {}
            for entry in partitions:
                tag = f"tqbroker-consume-{entry['partition']}"
                queues[tag] = (entry["partition"], entry["queue"])
                client.consume(entry["queue"], tag, arguments)
            printed = 0
            for item in client.deliveries(timeout=args.idle):
                if isinstance(item, Cancelled):  # the group gave the partition to another
                    client.consume(queues[item.consumer_tag][1], item.consumer_tag, arguments)
                    continue
                print(_format(item, queues[item.consumer_tag][0], args.format), flush=True)
                client.ack(item.delivery_tag)
                printed += 1
                if args.n is not None and printed >= args.n:
                    break
    except (OSError, ClientError) as exc:
        raise CommandError(f"{args.url}: {exc}") from None
    return 0


def parse_start(text: str) -> FieldValue:
    """``--from``: first, last, next, an offset, or an ISO-8601 time (UTC unless it says)."""
    if text in ("first", "last", "next"):
        return text
    if text.isdigit():
        return int(text)
    moment = clock.parse_iso_time(text)
    if moment is None:
        raise CommandError(
            f"--from wants first, last, next, an offset or an ISO-8601 time (got {text!r})"
        )
    return moment


def _format(delivery: Delivery, partition: int, style: str) -> str:
    if style == "value":
        return delivery.body.decode(errors="replace")
    offset = (delivery.properties.headers or {}).get("x-stream-offset")
    return json.dumps(
        {
            "partition": partition,
            "offset": offset if isinstance(offset, int) else None,
            "key": delivery.routing_key,
            "value": delivery.body.decode(errors="replace"),
        }
    )


# -- HTTP ----------------------------------------------------------------------------------------


def _http(args: argparse.Namespace, method: str, path: str, body: object = None) -> Any:
    url = args.http.rstrip("/") + path
    if args.vhost != "/":
        url += f"?vhost={_quote(args.vhost)}"
    data = json.dumps(body).encode() if body is not None else None
    credentials = base64.b64encode(args.user.encode()).decode()
    headers = {"content-type": "application/json", "authorization": f"Basic {credentials}"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["message"]
        except (ValueError, KeyError):
            message = str(exc)
        raise CommandError(f"{exc.code}: {message}") from None
    except OSError as exc:
        raise CommandError(f"cannot reach {args.http}: {exc}") from None


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")
