"""``tqbroker-ctl`` (also ``python -m tqbroker ctl``): the command-line tools for a running
broker, RabbitMQ's and Kafka's in one:

- rabbitmqctl-style, over the RabbitMQ-compatible management API (``rabbit.py``): ``list``,
  ``purge``, ``delete``, ``close-connection``, ``export-definitions``, ``import-definitions``,
  ``status``; users, permissions, vhosts and limits (``users.py``): ``add-user``,
  ``delete-user``, ``change-password``, ``set-user-tags``, ``set-permissions``, ``add-vhost``,
  ``delete-vhost``, ``set-vhost-limits``, ``set-user-limits``, ``list-users`` ...;
- kafka-topics and kafka-consumer-groups style, over the topic routes: ``topics ...``
  (``topics.py``), ``groups ...`` (``groups.py``);
- kcat style: ``produce`` (``produce.py``) and ``consume`` (``consume.py``);
- a cluster's nodes, controller and partitions: ``cluster status`` (``cluster.py``).

One setting says where the broker is and who logs in: ``--url http://user:password@host:15672``
(or ``TQBROKER_URL``; ``api.py``). ``--format table|json`` everywhere. Problems are one line on
standard error: exit status 1 at run time, 2 for a command line that cannot be used.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from . import cluster, consume, groups, produce, rabbit, topics, users
from .api import AMQP_URL_VARIABLE, URL_VARIABLE, Api, CommandError, UsageError
from .output import FORMATS

PROG = "tqbroker-ctl"


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (exit status 2), as every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (--help says more)\n")


def _common(defaults: bool) -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (a command's own copy has
    no defaults, so it only overrides what was given)."""
    common = argparse.ArgumentParser(add_help=False)
    default = None if defaults else argparse.SUPPRESS
    common.add_argument(
        "--url",
        default=default,
        help=f"the broker's HTTP API with credentials, http://user:password@host:15672, or a "
        f"cluster's nodes comma-separated (one refusing connections is passed over) "
        f"(${URL_VARIABLE}; default http://guest:guest@127.0.0.1:15672)",
    )
    common.add_argument(
        "--amqp-url",
        default=default,
        help=f"consume: the AMQP address if not the one the broker reports (${AMQP_URL_VARIABLE})",
    )
    common.add_argument(
        "--vhost", "-p", default="/" if defaults else argparse.SUPPRESS, help="virtual host (/)"
    )
    common.add_argument(
        "--format",
        default="table" if defaults else argparse.SUPPRESS,
        help="table (default) or json; consume: value, json or a kcat format string",
    )
    return common


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        parents=[_common(True)],
        description="Manage a running tqbroker (or RabbitMQ, for the management commands).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _common(False)
    rabbit.add(commands, common)
    users.add(commands, common)
    topics.add(commands, common)
    groups.add(commands, common)
    produce.add(commands, common)
    consume.add(commands, common)
    cluster.add(commands, common)
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.vhost_given = any(
        a in ("--vhost", "-p") or a.startswith("--vhost=")
        for a in (sys.argv[1:] if argv is None else argv)
    )
    what = getattr(args, "action", None) or getattr(args, "kind", None)  # topics list, list queues
    name = " ".join(filter(None, [args.command, what]))
    try:
        if args.command != "consume" and args.format not in FORMATS:
            raise UsageError(f"--format wants table or json (got {args.format!r})")
        return int(args.run(args, Api(args.url, args.vhost)))
    except UsageError as exc:
        print(f"{prog} {name}: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"{prog} {name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # | head: stop quietly (nothing left to flush at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
