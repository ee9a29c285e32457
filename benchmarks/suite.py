"""tqbroker against RabbitMQ: the same workloads against both brokers in one run, one table.

    python benchmarks/suite.py [--rabbitmq auto|start|none] [--rabbitmq-url amqp://...]
                               [--runs 3] [--messages 200000] [--queued 1000000]
                               [--workloads publish-transient,consume,...] [--json out.json]
                               [--mode multi|single|both] [--smoke]

The workloads are described in ``workloads.py``; the load comes from worker processes using the
lean raw-socket client (``loadgen.py``, ``rawclient.py``).

Responsibilities (the command line; the parts live beside it):
- targets (``targets.py``): tqbroker started here (``python -m tqbroker``, log backend, fsync
  before confirm); RabbitMQ started here on loopback (a private node, stopped afterwards), or
  any broker at an AMQP URL;
- runs: every workload ``--runs`` times per target, targets interleaved run by run; with
  ``--mode both``, the whole suite in the multi-process mode, then in the single-connection
  mode (one publisher connection, one consumer connection, one process per side);
- output (``report.py``): one table of medians (workload | tqbroker | RabbitMQ | ratio | broker
  CPU | client CPU) and its notes, and with ``--json`` every run, the machine, the versions and
  the load average.
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from procstats import IDLE_LOAD, py_spy, wait_for_idle
from report import Results, find_row, format_value, notes, record, table
from targets import Epmd, ExternalTarget, RabbitMQTarget, Target, TqbrokerTarget, rabbit_script
from workloads import SMOKE, WORKLOADS, Settings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    settings = _settings(args, parser)
    workloads = _workloads(args, parser)
    if args.rabbitmq == "start" and not args.rabbitmq_url and _rabbitmq_scripts(args) is None:
        parser.error("--rabbitmq start: rabbitmq-server or rabbitmqctl not found")

    if args.wait_idle:
        wait_for_idle(args.wait_idle, _log)
    load_before = os.getloadavg()
    if load_before[0] > IDLE_LOAD:
        _log(f"warning: load average {load_before[0]:.2f}: the machine is not idle")

    epmd = Epmd()
    targets: list[Target] = []
    with tempfile.TemporaryDirectory(prefix="tqbroker-suite-", dir=args.dir) as tmp:
        try:
            _start_targets(args, Path(tmp), epmd, targets)
            versions = {t.name: t.version() for t in targets}
            _log("; ".join(f"{name}: {v}" for name, v in versions.items()))
            by_mode: dict[str, tuple[Settings, Results]] = {}
            for mode in MODES[args.mode]:
                moded = replace(settings, mode=mode)
                _log(f"-- mode {mode}: {MODE_TITLES[mode]}")
                by_mode[mode] = (moded, run_suite(targets, workloads, moded, _log))
        finally:
            for target in targets:
                target.close()
            epmd.cleanup()

    records: dict[str, object] = {}
    for mode, (moded, results) in by_mode.items():
        if len(by_mode) > 1:
            print(f"\n### mode {mode}: {MODE_TITLES[mode]}\n")
        print(table(results, targets, workloads))
        print("\n".join(notes(results, targets, moded)))
        records[mode] = record(
            results, targets, workloads, moded, versions=versions, load_before=load_before
        )
    if args.json:
        found = records if len(records) > 1 else next(iter(records.values()))
        args.json.write_text(json.dumps(found, indent=2) + "\n")
    return 1 if any(results.errors for _s, results in by_mode.values()) else 0


MODES = {"multi": ["multi"], "single": ["single"], "both": ["multi", "single"]}
MODE_TITLES = {
    "multi": "one worker process per consumer (fanout: one per queue)",
    "single": "one publisher connection, one consumer connection, one process per side",
}


def run_suite(
    targets: list[Target], workloads: list[str], s: Settings, log: Callable[[str], None]
) -> Results:
    """Every workload ``s.runs`` times per target, targets interleaved run by run; a failed
    run is reported and the suite goes on."""
    results = Results()
    for name in workloads:
        for run in range(s.runs):
            for target in targets:
                log(f"{name}: run {run + 1}/{s.runs} on {target.name} ...")
                started = time.perf_counter()
                try:
                    measures = WORKLOADS[name](target, s, f"{run}")
                except Exception as exc:  # reported; the suite goes on
                    results.fail(target.name, name, f"{type(exc).__name__}: {exc}")
                    log(f"  failed: {type(exc).__name__}: {exc}")
                    continue
                results.add(target.name, measures)
                took = time.perf_counter() - started
                shown = ", ".join(
                    f"{key} {format_value(m.value, find_row(key).unit)}"
                    for key, m in measures.items()
                )
                log(f"  {shown} ({took:.1f} s)")
    return results


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the command line ------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rabbitmq",
        choices=["auto", "start", "none"],
        default="auto",
        help="start a private RabbitMQ node on loopback: auto (if installed), start, none",
    )
    parser.add_argument("--rabbitmq-url", help="compare with the broker at this AMQP URL instead")
    parser.add_argument("--rabbitmq-pid", type=int, help="its process (found by port if local)")
    parser.add_argument(
        "--rabbitmq-server",
        default=rabbit_script("rabbitmq-server"),
        help="the rabbitmq-server script (bypassing Debian's wrapper that switches user)",
    )
    parser.add_argument("--rabbitmqctl", default=rabbit_script("rabbitmqctl"))
    parser.add_argument("--tqbroker-url", help="use this running tqbroker instead of starting one")
    parser.add_argument("--tqbroker-pid", type=int, help="its process (found by port if local)")
    parser.add_argument(
        "--tqbroker-arg",
        action="append",
        default=[],
        help="an argument for python -m tqbroker (repeatable): --tqbroker-arg=--fsync=never",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, from: {', '.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--mode",
        choices=list(MODES),
        default="multi",
        help="load generator: multi (a process per consumer), single (one connection and "
        "process per side), both (the suite twice, a table each)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one run: does it work")
    parser.add_argument("--runs", type=int, help="runs per workload and broker (median reported)")
    parser.add_argument("--messages", type=int, help="messages per throughput run (200,000)")
    parser.add_argument("--queued", type=int, help="messages queued for memory/recovery (1M)")
    parser.add_argument("--body-size", type=int, help="message body bytes (1024)")
    parser.add_argument("--latency-seconds", type=float, help="length of the latency run (10)")
    parser.add_argument("--latency-rate", type=float, help="msg/s of the latency run (2000)")
    parser.add_argument("--json", type=Path, help="write every run and the machine here")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=f"first wait up to this long for the load average to fall under {IDLE_LOAD}",
    )
    parser.add_argument("--dir", type=Path, help="where brokers keep their data (a temp dir)")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record tqbroker with py-spy during every timed phase, one file each in DIR",
    )
    parser.add_argument(
        "--profile-format", choices=["flamegraph", "speedscope", "raw"], default="flamegraph"
    )
    return parser


def _settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    """The sizes: ``SMOKE`` or the defaults, with what the command line sets."""
    settings = SMOKE if args.smoke else Settings()
    overrides: dict[str, object] = {
        "runs": args.runs,
        "messages": args.messages,
        "queued": args.queued,
        "body_size": args.body_size,
        "latency_seconds": args.latency_seconds,
        "latency_rate": args.latency_rate,
    }
    if args.profile is not None:
        if py_spy() is None:
            parser.error("--profile needs py-spy (pip install py-spy)")
        args.profile.mkdir(parents=True, exist_ok=True)
        overrides["profile"] = str(args.profile.resolve())
        overrides["profile_format"] = args.profile_format
    return Settings(**{**asdict(settings), **{k: v for k, v in overrides.items() if v}})


def _workloads(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    return workloads


def _rabbitmq_scripts(args: argparse.Namespace) -> tuple[str, str] | None:
    """rabbitmq-server (found) and rabbitmqctl, if both are installed."""
    found = args.rabbitmq_server and shutil.which(args.rabbitmq_server)
    if found and args.rabbitmqctl and shutil.which(args.rabbitmqctl):
        return found, args.rabbitmqctl
    return None


# -- targets ---------------------------------------------------------------------------------


def _start_targets(args: argparse.Namespace, root: Path, epmd: Epmd, targets: list[Target]) -> None:
    """Start (or find) tqbroker and the broker to compare with, appending each to ``targets``
    as soon as it runs (the caller closes them)."""
    if args.tqbroker_url:
        targets.append(ExternalTarget("tqbroker", args.tqbroker_url, args.tqbroker_pid))
    else:
        targets.append(TqbrokerTarget(root / "tqbroker", args.tqbroker_arg).start())
    if args.rabbitmq_url:
        targets.append(ExternalTarget("RabbitMQ", args.rabbitmq_url, args.rabbitmq_pid))
    elif args.rabbitmq != "none":
        scripts = _rabbitmq_scripts(args)
        if scripts is not None:
            _log("starting RabbitMQ on loopback ...")
            server, ctl = scripts
            targets.append(RabbitMQTarget(root / "rabbitmq", server, ctl, epmd=epmd).start())
        else:
            _log("RabbitMQ is not installed: tqbroker alone")


if __name__ == "__main__":
    sys.exit(main())
