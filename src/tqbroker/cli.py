"""The command line: ``python -m tqbroker [--host H] [--port P] [--data-dir D]`` runs a broker;
``python -m tqbroker ctl ...`` (the same as ``tqbroker-ctl``) manages a running one (``ctl/``).

Responsibilities:
- parse flags into a ``BrokerConfig`` (embedded defaults: 127.0.0.1:5672, HTTP API on 15672,
  ./tqbroker-data, guest/guest from loopback only, vhost ``/``);
- print one startup line naming the bound address;
- SIGINT / SIGTERM: graceful shutdown within the configured deadline, exit status 0.
"""

from __future__ import annotations

import argparse
import gc
import logging
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from ._version import __version__
from .backends.log import parse_fsync_policy
from .broker.definitions import StartupError
from .config import BrokerConfig, ConfigError, load_config
from .fsutil import make_dirs
from .server.listener import serve

GC_THRESHOLDS = (20_000, 5, 10)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tqbroker",
        description="Run a tqbroker broker (no COMMAND), or talk to a running one (a COMMAND).",
    )
    parser.add_argument("--config", type=Path, help="a TOML configuration file (optional)")
    parser.add_argument("--host", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, help="AMQP port, 0 = ephemeral (5672)")
    parser.add_argument(
        "--http-port", type=int, help="HTTP API port, 0 = ephemeral, -1 = off (15672)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="Prometheus metrics port, 0 = ephemeral, -1 = off (15692)",
    )
    parser.add_argument(
        "--definitions",
        type=Path,
        help="a definitions file (RabbitMQ's JSON) to import at boot (load_definitions)",
    )
    parser.add_argument("--data-dir", help="where data lives (./tqbroker-data)")
    parser.add_argument(
        "--durable-backend",
        help="storage of durable queues: log (default), rocksdb, or any installed backend",
    )
    parser.add_argument(
        "--fsync",
        help="log backend: batch (default: fsync before confirming), interval:<ms>, or never",
    )
    parser.add_argument(
        "--memory-high-watermark",
        help="block publishers while the broker's memory is over this: a fraction of RAM (or of "
        "the cgroup limit) such as 0.4 (default), or a size such as 512MiB",
    )
    parser.add_argument(
        "--disk-free-limit",
        help="block publishers while the data directory's free disk space is under this: a "
        "size such as 50MB (default) or 2GiB, or a multiple of RAM such as 1.0",
    )
    parser.add_argument(
        "--keep-unloadable-definitions",
        action="store_true",
        default=None,
        help="start even if a stored exchange's type does not load or a stored queue's "
        "arguments no longer validate, keeping them dormant (default: refuse to start)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument("--version", action="version", version=f"tqbroker {__version__}")
    tools = parser.add_subparsers(title="tools for a running broker", metavar="COMMAND")
    tools.add_parser("ctl", help="manage a running broker (tqbroker-ctl; ctl --help)")
    return parser.parse_args(argv)


async def run(config: BrokerConfig) -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(
            lambda task_status: serve(config, shutdown=shutdown, task_status=task_status)
        )
        bound = ", ".join(
            [f"amqp://{host}:{port}" for host, port in listening.amqp]
            + [f"http://{host}:{port}" for host, port in listening.http]
        )
        print(f"tqbroker {__version__} ready: listening on {bound}", flush=True)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                logging.getLogger("tqbroker").info(
                    "received %s: shutting down", signal.Signals(signum).name
                )
                shutdown.set()
                break


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["ctl"]:
        from .ctl import main as ctl_main

        return ctl_main(given[1:], prog="python -m tqbroker ctl")
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides: dict[str, Any] = {
        key: value
        for key, value in (
            ("host", args.host),
            ("port", args.port),
            ("data_dir", args.data_dir),
            ("durable_backend", args.durable_backend),
            ("keep_unloadable_definitions", args.keep_unloadable_definitions),
            ("memory_high_watermark", args.memory_high_watermark),
            ("disk_free_limit", args.disk_free_limit),
            ("load_definitions", args.definitions),
        )
        if value is not None
    }
    if args.http_port is not None:
        overrides["http_port"] = None if args.http_port < 0 else args.http_port
    if args.metrics_port is not None:
        overrides["metrics_port"] = None if args.metrics_port < 0 else args.metrics_port
    try:
        config = load_config(args.config, **overrides) if args.config else BrokerConfig(**overrides)
    except (ConfigError, ValueError) as exc:
        print(f"tqbroker: {exc}", file=sys.stderr)
        return 2
    if args.fsync is not None:
        try:
            parse_fsync_policy(args.fsync)
        except ValueError as exc:
            print(f"tqbroker: --fsync: {exc}", file=sys.stderr)
            return 2
        options = {name: dict(values) for name, values in config.backend_options.items()}
        options.setdefault("log", {})["fsync"] = args.fsync
        config = attrs.evolve(config, backend_options=options)
    try:
        make_dirs(config.data_dir)
    except OSError as exc:
        print(f"tqbroker: cannot start: cannot create the data directory: {exc}", file=sys.stderr)
        return 1
    _raise_open_file_limit()
    # The ~35,000 objects of the imported modules are never garbage: leaving them out of the
    # garbage collector's full collections shortens each pause by ~4 ms.
    gc.freeze()
    # Nearly everything the broker allocates per message is freed by reference counting, but
    # the default thresholds (700, 10, 10) run a collection every 700 allocations, walking the
    # queued messages again and again: 15-21% of the broker's CPU under publish load. Rarer
    # young collections (cycles still found, a little later) cut that to a few percent. Not
    # too rare: a pause walks what survived since, so (100000, 50) paused every client for
    # 20-65 ms (young) and up to 1.8 s (middle generation) while 100k queues were declared;
    # (20000, 5) bounds those to what 20k and 100k allocations leave, at the same CPU.
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        trio.run(run, config)
    except (OSError, StartupError, BaseExceptionGroup) as exc:
        error = _startup_error(exc)
        if error is None:
            raise
        print(f"tqbroker: cannot start: {error}", file=sys.stderr)
        return 1
    return 0


def _raise_open_file_limit() -> None:
    """Every durable queue keeps a few files open: use all the descriptors we may have."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logging.getLogger("tqbroker").warning("cannot raise the open file limit: %s", exc)


def _startup_error(exc: BaseException) -> OSError | StartupError | None:
    """The OSError (address in use, permission denied...) or configuration problem inside a
    possibly grouped error."""
    if isinstance(exc, OSError | StartupError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _startup_error(inner)
            if found is not None:
                return found
    return None
