"""``produce TOPIC``: each line of standard input becomes a record (over the HTTP API, which
answers once they are durable), as kafka-console-producer does:

- ``--key K`` for every record, or ``--key-separator SEP``: each line is ``KEY<SEP>VALUE``
  (Kafka's ``parse.key=true``; a line without the separator is an error, as in Kafka);
- ``--header NAME=VALUE`` (repeatable) on every record; ``--partition N`` instead of the key's
  partition; ``-v`` prints the partition and offset of each.

A line that is not UTF-8 travels as base64 (its bytes arrive as they are).
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from .api import Api, CommandError, UsageError, quote

BATCH = 500  # lines per HTTP request


def add(subparsers: argparse._SubParsersAction[Any], common: Any) -> None:
    produce = subparsers.add_parser(
        "produce", parents=[common], help="publish lines of standard input to a topic"
    )
    produce.add_argument("topic")
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument("--key", default="", help="the key of every record (partitioning)")
    keys.add_argument(
        "--key-separator", metavar="SEP", help="each line is KEY<SEP>VALUE (Kafka's parse.key)"
    )
    produce.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header on every record (repeatable)",
    )
    produce.add_argument("--partition", type=int, help="write to this partition (not the key's)")
    produce.add_argument(
        "-v", "--verbose", action="store_true", help="print partition and offset of each"
    )
    produce.set_defaults(run=produce_lines)


def produce_lines(args: argparse.Namespace, api: Api) -> int:
    headers: dict[str, str] = {}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header wants NAME=VALUE (got {item!r})")
        headers[name] = value
    if args.partition is not None and args.partition < 0:
        raise UsageError(f"--partition must be >= 0 (got {args.partition})")
    separator = args.key_separator.encode() if args.key_separator is not None else None
    if separator == b"":
        raise UsageError("--key-separator must not be empty")
    number = 0
    for batch in _batches(sys.stdin.buffer, BATCH):
        records = []
        for line in batch:
            number += 1
            key, value = args.key.encode(), line
            if separator is not None:
                key, found, value = line.partition(separator)
                if not found:
                    shown = line[:80].decode(errors="replace")
                    raise CommandError(f"No key separator found on line number {number}: '{shown}'")
            records.append(_record(value, key, headers, args.partition))
        reply = api.topics("POST", f"/topics/{quote(args.topic)}/messages", {"records": records})
        if args.verbose:
            for landed in reply["offsets"]:
                print(f"partition {landed['partition']} offset {landed['offset']}")
    return 0


def _record(
    value: bytes, key: bytes, headers: dict[str, str], partition: int | None
) -> dict[str, Any]:
    """A line as the HTTP API takes it: text, or base64 if it is not UTF-8."""
    try:
        record: dict[str, Any] = {"value": value.decode()}
    except UnicodeDecodeError:
        record = {"value": base64.b64encode(value).decode(), "encoding": "base64"}
    try:
        record["key"] = key.decode()
    except UnicodeDecodeError:
        raise CommandError(f"a key must be UTF-8 text (got {key!r})") from None
    if headers:
        record["headers"] = headers
    if partition is not None:
        record["partition"] = partition
    return record


def _batches(lines: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in lines:
        batch.append(line.rstrip(b"\r\n"))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
