"""``consume TOPIC``: print a topic's records as they come (over AMQP: a consumer on each
partition, acking what it printed), as kcat ``-C`` does:

- ``--from first|last|next|OFFSET|ISO-TIME`` where each partition starts (``next``: new ones);
- ``--group G``: share the partitions with the group's other members; a restart resumes at the
  group's committed offsets;
- ``--partition N``: only that partition; ``-n N`` stop after N; ``--idle S`` stop after S
  seconds without one;
- ``--format value`` (the default: the value and a newline), ``json`` (one object a line), or a
  kcat ``-f`` format string: ``%s`` value, ``%k`` key, ``%o`` offset, ``%p`` partition, ``%t``
  topic, ``%T`` timestamp (the AMQP timestamp property in ms; -1 without one), ``%h`` headers
  (``name=value`` comma-separated), ``%S`` value size, ``%K`` key size, ``%%``, ``\\n``,
  ``\\t``. As in kcat, no newline is added: end the format with ``\\n``.

The AMQP address comes from the broker (``--amqp-url`` overrides it); the credentials are the
``--url``'s, and no error shows them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import clock
from ..client import Cancelled, Client, ClientError, Delivery
from ..protocol.codec import FieldTable, FieldValue
from .api import Api, CommandError, UsageError, quote, redact

_FIELDS = "skoptThSK%"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def add(subparsers: argparse._SubParsersAction[Any], common: Any) -> None:
    consume = subparsers.add_parser("consume", parents=[common], help="print a topic's records")
    consume.add_argument("topic")
    consume.add_argument(
        "--from",
        dest="start",
        default="next",
        help="first, last, next (default), an offset, or an ISO-8601 time",
    )
    consume.add_argument("-n", type=int, help="stop after N records")
    consume.add_argument("--group", help="consume as a member of this consumer group")
    consume.add_argument("--partition", type=int, help="only this partition")
    consume.add_argument("--idle", type=float, help="stop after this many seconds without a record")
    consume.set_defaults(run=consume_records)


def parse_start(text: str) -> FieldValue:
    """``--from``: first, last, next, an offset, or an ISO-8601 time (UTC unless it says)."""
    if text in ("first", "last", "next"):
        return text
    if text.isdigit():
        return int(text)
    moment = clock.parse_iso_time(text)
    if moment is None:
        raise UsageError(
            f"--from wants first, last, next, an offset or an ISO-8601 time (got {text!r})"
        )
    return moment


def check_format(style: str) -> str:
    """``--format``: value, json, or a kcat format string (checked here: usage errors)."""
    if style in ("value", "json", "table"):
        return "value" if style == "table" else style
    i = 0
    while i < len(style):
        if style[i] == "%":
            if i + 1 >= len(style) or style[i + 1] not in _FIELDS:
                raise UsageError(
                    f"--format: unknown field {style[i : i + 2]!r} (fields: "
                    + ", ".join(f"%{c}" for c in _FIELDS)
                    + ")"
                )
            i += 1
        i += 1
    return style


def render(style: str, topic: str, partition: int, delivery: Delivery) -> str:
    """One record as ``style`` says (value and json end with a newline; a format string
    ends as it ends, as in kcat)."""
    headers = dict(delivery.properties.headers or {})
    offset = headers.pop("x-stream-offset", None)
    value = delivery.body.decode(errors="replace")
    if style == "value":
        return value + "\n"
    if style == "json":
        record = {
            "partition": partition,
            "offset": offset if isinstance(offset, int) else None,
            "key": delivery.routing_key,
            "headers": {k: _text(v) for k, v in headers.items()},
            "value": value,
        }
        return json.dumps(record, ensure_ascii=False) + "\n"
    stamp = delivery.properties.timestamp
    fields = {
        "s": value,
        "k": delivery.routing_key,
        "o": str(offset),
        "p": str(partition),
        "t": topic,
        "T": str(stamp * 1000) if stamp is not None else "-1",
        "h": ",".join(f"{k}={_text(v)}" for k, v in headers.items()),
        "S": str(len(delivery.body)),
        "K": str(len(delivery.routing_key.encode())),
        "%": "%",
    }
    out = []
    i = 0
    while i < len(style):
        char = style[i]
        if char == "%" and i + 1 < len(style):
            out.append(fields[style[i + 1]])
            i += 2
        elif char == "\\" and i + 1 < len(style) and style[i + 1] in _ESCAPES:
            out.append(_ESCAPES[style[i + 1]])
            i += 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def consume_records(args: argparse.Namespace, api: Api) -> int:
    start = parse_start(args.start)
    style = check_format(args.format)
    partitions = api.topics("GET", f"/topics/{quote(args.topic)}/offsets")["partitions"]
    if args.partition is not None:
        partitions = [p for p in partitions if p["partition"] == args.partition]
        if not partitions:
            raise CommandError(f"topic '{args.topic}' has no partition {args.partition}")
    arguments: FieldTable = {"x-stream-offset": start}
    if args.group:
        arguments["x-stream-group"] = args.group
    url = api.amqp_url(args.amqp_url)
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
                partition = queues[item.consumer_tag][0]
                sys.stdout.write(render(style, args.topic, partition, item))
                sys.stdout.flush()
                client.ack(item.delivery_tag)
                printed += 1
                if args.n is not None and printed >= args.n:
                    break
    except BrokenPipeError:
        raise  # the reader went away (| head): not an error
    except (OSError, ClientError, ValueError) as exc:
        raise CommandError(f"{redact(url)}: {exc}") from None
    return 0
