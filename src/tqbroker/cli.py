"""The command line: ``python -m tqbroker [--host H] [--port P] [--data-dir D]`` runs a broker;
``python -m tqbroker ctl ...`` (the same as ``tqbroker-ctl``) manages a running one (``ctl/``).

Responsibilities:
- flags over ``TQBROKER_*`` variables over the config file over the embedded defaults
  (127.0.0.1:5672, HTTP API on 15672, ./tqbroker-data, guest/guest from loopback only, vhost
  ``/``) into a ``BrokerConfig`` (``settings.py``); any bad value, a data directory the broker
  cannot write or a log file it cannot open: one line naming the setting, exit status 2;
  ``--print-config`` prints the result as TOML;
- logging as configured (``logsetup.py``); one startup line naming the bound address, and
  ``READY=1`` to systemd (``sdnotify.py``);
- SIGINT / SIGTERM: ``STOPPING=1``, graceful shutdown within the configured deadline, exit 0;
  SIGHUP reopens the log file and reloads the TLS certificate (it does not stop the broker);
- a TLS certificate or key that cannot be used: one line naming it, exit status 2;
- a data directory another broker holds (``dirlock.py``): one line naming it and the holder's
  PID, exit status 1, the directory unchanged.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import trio

from ._version import __version__
from .backends.log import parse_fsync_policy
from .broker import garbage
from .broker.definitions import StartupError
from .config import BrokerConfig, ConfigError, SettingError
from .dirlock import DataDirInUse
from .logsetup import configure_logging, reopen_log_file
from .sdnotify import notify
from .server.listener import serve
from .server.tls import server_context
from .settings import parse_setting, resolve, to_toml
from .storage_env import StorageEnv

# Flags that set a BrokerConfig key: (flag, key); each is parsed and range-checked as the
# key's environment variable is (settings.parse_setting), its error naming the flag.
SETTING_FLAGS = (
    ("--host", "host"),
    ("--port", "port"),
    ("--http-port", "http_port"),
    ("--metrics-port", "metrics_port"),
    ("--kafka-port", "kafka_port"),
    ("--kafka-tls-port", "kafka_tls_port"),
    ("--kafka-advertised-address", "kafka_advertised_address"),
    ("--definitions", "load_definitions"),
    ("--data-dir", "data_dir"),
    ("--durable-backend", "durable_backend"),
    ("--memory-high-watermark", "memory_high_watermark"),
    ("--disk-free-limit", "disk_free_limit"),
    ("--keep-unloadable-definitions", "keep_unloadable_definitions"),
    ("--log-level", "log_level"),
    ("--log-format", "log_format"),
    ("--log-file", "log_file"),
    ("--http-access-log", "http_access_log"),
    ("--tls-port", "tls_port"),
    ("--tls-certfile", "tls_certfile"),
    ("--tls-keyfile", "tls_keyfile"),
    ("--tls-cacertfile", "tls_cacertfile"),
    ("--tls-verify-peer", "tls_verify_peer"),
    ("--tls-fail-if-no-peer-cert", "tls_fail_if_no_peer_cert"),
    ("--tls-only", "tls_only"),
    ("--http-tls", "tls_http"),
    ("--cluster-etcd", "cluster_etcd"),
    ("--node-id", "node_id"),
    ("--advertise", "advertise"),
    ("--peer-port", "peer_port"),
    ("--advertise-peer-port", "advertise_peer_port"),
    ("--cluster-placement", "cluster_placement"),
)
HELP = {
    "--host": "address to listen on (127.0.0.1)",
    "--port": "AMQP port, 0 = ephemeral (5672)",
    "--http-port": "HTTP API port, 0 = ephemeral, off (or -1) = no HTTP API (15672)",
    "--metrics-port": "Prometheus metrics port, 0 = ephemeral, off (or -1) = none (15692)",
    "--kafka-port": "Kafka listener port, 0 = ephemeral, off = none (9092; ephemeral when "
    "--port is 0)",
    "--kafka-tls-port": "Kafka TLS listener port (SSL, SASL_SSL), with a [tls] certificate; 0 "
    "= ephemeral, off = none (9093; ephemeral when --port is 0)",
    "--kafka-advertised-address": "host:port the Kafka listener gives clients in its metadata "
    "(Kafka's advertised.listeners; default: the address each client connected to)",
    "--definitions": "a definitions file (RabbitMQ's JSON) to import at boot (load_definitions)",
    "--data-dir": "where data lives (./tqbroker-data)",
    "--durable-backend": "storage of durable queues: log (default), rocksdb, or any installed "
    "backend",
    "--memory-high-watermark": "block publishers while the broker's memory is over this: a "
    "fraction of RAM (or of the cgroup limit) such as 0.4 (default), or a size such as 512MiB",
    "--disk-free-limit": "block publishers while the data directory's free disk space is under "
    "this: a size such as 50MB (default) or 2GiB, or a multiple of RAM such as 1.0",
    "--keep-unloadable-definitions": "start even if a stored exchange's type does not load or a "
    "stored queue's arguments no longer validate, keeping them dormant (default: refuse)",
    "--log-level": "DEBUG, INFO (default), WARNING, ERROR or CRITICAL, in any case",
    "--log-format": "text (default) or json (one object per line)",
    "--log-file": "log to this file (reopened when logrotate moves it) instead of stderr",
    "--http-access-log": "log every HTTP API request (off by default)",
    "--tls-port": "amqps port, 0 = ephemeral (5671); listens when a certificate and key are set",
    "--tls-certfile": "the server's certificate chain (PEM) for amqps (and HTTPS)",
    "--tls-keyfile": "the certificate's private key (PEM, unencrypted)",
    "--tls-cacertfile": "the CAs client certificates are checked against (PEM)",
    "--tls-verify-peer": "check a client certificate when one is sent (needed for EXTERNAL)",
    "--tls-fail-if-no-peer-cert": "with --tls-verify-peer: refuse clients without a certificate",
    "--tls-only": "no plaintext AMQP port: amqps only",
    "--http-tls": "the HTTP API and metrics ports serve HTTPS, with the same certificate",
    "--cluster-etcd": "join a cluster: etcd's client URLs, comma-separated (docs/cluster.md)",
    "--node-id": "this node's id in the cluster (default: the data directory's, new at first)",
    "--advertise": "the host other nodes and clients reach this node on (default: --host)",
    "--peer-port": "the node-to-node link's port, 0 = ephemeral (25672)",
    "--advertise-peer-port": "the port other nodes reach the link on, when a proxy or NAT is "
    "in between (default: --peer-port)",
    "--cluster-placement": "where the controller puts new partitions' leaders: spread (default) "
    "over the nodes, or colocate on one",
}
SWITCHES: tuple[str, ...] = ("--keep-unloadable-definitions", "--http-access-log")
SWITCHES += ("--tls-verify-peer", "--tls-fail-if-no-peer-cert", "--tls-only", "--http-tls")
# The exit status of a configuration error (a flag, a variable, the file, the data directory),
# as argparse's; 1 is a broker that could not start (a port in use...).
CONFIG_ERROR = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tqbroker",
        # No abbreviations: the tools' own flags (``--http``) are not prefixes of ours.
        allow_abbrev=False,
        description="Run a tqbroker broker (no COMMAND), or talk to a running one (a COMMAND). "
        "Every setting can also come from the config file or a TQBROKER_<KEY> environment "
        "variable (flags win over variables, variables over the file).",
    )
    parser.add_argument(
        "--config", type=Path, help="a TOML configuration file (optional; or TQBROKER_CONFIG)"
    )
    for flag, key in SETTING_FLAGS:
        if flag in SWITCHES:
            parser.add_argument(flag, dest=key, action="store_true", default=None, help=HELP[flag])
        else:
            parser.add_argument(flag, dest=key, metavar=key.upper(), help=HELP[flag])
    parser.add_argument(
        "--fsync",
        help="log backend: batch (default: fsync before confirming), interval:<ms>, or never",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration as TOML (passwords redacted) and exit",
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
        http = "https" if config.tls.http else "http"
        bound = ", ".join(
            [f"amqp://{host}:{port}" for host, port in listening.amqp]
            + [f"amqps://{host}:{port}" for host, port in listening.amqps]
            + [f"{http}://{host}:{port}" for host, port in listening.http]
            + [f"metrics {http}://{host}:{port}/metrics" for host, port in listening.metrics]
            + [f"kafka {host}:{port}" for host, port in listening.kafka]
            + [f"kafka+ssl {host}:{port}" for host, port in listening.kafka_tls]
        )
        # Handle the signals before saying "ready": a SIGTERM right after READY=1 (a service
        # manager stopping what it just started) is a graceful shutdown, not a kill.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            print(f"tqbroker {__version__} ready: listening on {bound}", flush=True)
            notify(f"READY=1\nSTATUS=listening on {bound}\nMAINPID={os.getpid()}")
            async for signum in signals:
                if signum == signal.SIGHUP:  # a logrotate postrotate habit: not a kill
                    reopen_log_file()
                    if listening.tls is not None:
                        listening.tls.reload()  # new connections get the new certificate
                    continue
                logging.getLogger("tqbroker").info(
                    "received %s: shutting down", signal.Signals(signum).name
                )
                notify("STOPPING=1\nSTATUS=shutting down")
                shutdown.set()
                break


def effective_config(args: argparse.Namespace, environ: Mapping[str, str]) -> BrokerConfig:
    """The configuration from the defaults, the file, the environment and the flags (each
    a layer over the previous one). Raises ``ValueError`` with one line naming the setting."""
    flags: dict[str, object] = {}
    for flag, key in SETTING_FLAGS:
        text = getattr(args, key)
        if text is None:
            continue
        if text is True:
            text = "true"
        if key in ("http_port", "metrics_port") and text == "-1":
            text = "off"  # the flags' "off" before there was one
        flags[key] = parse_setting(key, text, flag)
    path = args.config or (
        Path(environ["TQBROKER_CONFIG"]) if environ.get("TQBROKER_CONFIG") else None
    )
    backend_flags = {}
    if args.fsync is not None:
        try:
            parse_fsync_policy(args.fsync)
        except ValueError as exc:
            raise SettingError("--fsync", str(exc)) from None
        backend_flags["log"] = {"fsync": args.fsync}
    return resolve(path, environ, flags, backend_flags)


def check_data_dir(path: Path) -> None:
    """Create the data directory if needed and make sure the broker can write there: a file in
    the way, or a directory the broker may not write to, is a ``SettingError``."""
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                raise SettingError("data_dir", f"{existing} is a file, not a directory")
            break
    try:
        StorageEnv.default().make_dirs(path)
    except OSError as exc:
        raise SettingError("data_dir", f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise SettingError("data_dir", f"{path} is not writable: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["ctl"]:
        from .ctl import main as ctl_main

        return ctl_main(given[1:], prog="python -m tqbroker ctl")
    args = parse_args(argv)
    try:
        config = effective_config(args, os.environ)
        if args.print_config:
            print(to_toml(config), end="")
            return 0
        try:
            configure_logging(config)
        except OSError as exc:
            raise SettingError(
                "log_file", f"cannot open {config.log_file}: {exc.strerror or exc}"
            ) from None
        check_data_dir(config.data_dir)
        if config.tls.enabled:
            server_context(config.tls)  # TlsError: a file missing, unreadable, not matching
    except (ConfigError, ValueError) as exc:
        print(f"tqbroker: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    _raise_open_file_limit()
    # Frozen imports, small young collections, no automatic full one (``broker/garbage.py``).
    garbage.take_over()
    try:
        trio.run(run, config)
    except (OSError, StartupError, DataDirInUse, BaseExceptionGroup) as exc:
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


def _startup_error(exc: BaseException) -> OSError | StartupError | DataDirInUse | None:
    """The OSError (address in use, permission denied...), configuration problem or data
    directory held by another broker inside a possibly grouped error."""
    if isinstance(exc, OSError | StartupError | DataDirInUse):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _startup_error(inner)
            if found is not None:
                return found
    return None
