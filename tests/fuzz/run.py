"""Coverage-guided fuzzing of the fuzz targets with atheris (libFuzzer for Python).

From the repository root::

    python -m tests.fuzz.run --list                      # the targets
    python -m tests.fuzz.run --seconds 600 frames        # one target for 10 minutes
    python -m tests.fuzz.run --seconds 600 frames log    # several, one after the other
    python -m tests.fuzz.run --seconds 3600 every        # every target, 1 hour each
    python -m tests.fuzz.run --seconds 60 all            # one run over all of them at once
    python -m tests.fuzz.run frames crash-1a2b3c         # replay an input (libFuzzer's args)

Each run starts from the checked-in seeds (``tests/fuzz/corpus/<target>/``) and grows a
working corpus in a temporary directory (``--corpus DIR`` keeps it, in ``DIR/<target>``). A
failing input is written to ``--artifacts`` (``./fuzz-artifacts/`` by default) and the run
exits non-zero. Arguments after the targets go to libFuzzer as they are (``-max_len=65536``,
``-dict=...``). An input over the time budget counts only if it is over it without atheris'
instrumentation too (a fresh process replays it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
# Import the targets as the test suite does (the repository root on the path, package
# ``tests.fuzz``).
sys.path.insert(0, str(HERE.parents[1]))
# How much slower the instrumented targets run (measured: 10-20 times).
INSTRUMENTED_SLOWDOWN = 5


def _arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=int, default=60, help="time per target (default 60)")
    parser.add_argument("--runs", type=int, default=-1, help="stop after this many inputs")
    parser.add_argument("--corpus", type=Path, help="the working corpus to grow (kept)")
    parser.add_argument("--artifacts", type=Path, default=Path("fuzz-artifacts"))
    parser.add_argument("--list", action="store_true", help="list the targets")
    parser.add_argument("targets", nargs="*", help="target names, 'all' or 'every'")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--confirm-slow", help=argparse.SUPPRESS)
    parser.add_argument("--seeds", type=Path, help=argparse.SUPPRESS)
    return parser.parse_known_args(argv)


def main(argv: list[str]) -> int:
    args, extra = _arguments(argv)
    if args.confirm_slow:
        return _confirm_slow(args.confirm_slow)
    if args.child:
        return _fuzz(args.child, args, extra)
    from tests.fuzz.targets import ORDER, TARGETS  # not in the child: it instruments them first

    if args.list or not args.targets:
        for name in ORDER:
            print(f"{name:14} {TARGETS[name].doc}")
        print(f"{'all':14} every target at once (the first byte picks one)")
        print(f"{'every':14} each target in turn, --seconds each")
        return 0
    names = list(ORDER) if args.targets == ["every"] else args.targets
    targets = [n for n in names if n in (*TARGETS, "all")]
    extra += [n for n in names if n not in targets]  # inputs to replay
    if not targets:
        print(f"unknown target(s) {names}; --list shows them", file=sys.stderr)
        return 2
    status = 0
    for name in targets:
        if len(targets) > 1:
            print(f"=== {name}", flush=True)
        memory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(prefix=f"tqbroker-fuzz-{name}-", dir=memory) as workdir:
            seeds = Path(workdir) / "seeds"
            seeds.mkdir()
            for i, target_name in enumerate(ORDER):
                if name not in ("all", target_name):
                    continue
                prefix = bytes((i,)) if name == "all" else b""
                for seed in sorted((CORPUS / target_name).glob("*")):
                    (seeds / f"{target_name}-{seed.name}").write_bytes(prefix + seed.read_bytes())
            corpus = (args.corpus or Path(workdir)) / name
            corpus.mkdir(parents=True, exist_ok=True)
            args.artifacts.mkdir(parents=True, exist_ok=True)
            command = [
                sys.executable,
                "-m",
                "tests.fuzz.run",
                "--child",
                name,
                "--seconds",
                str(args.seconds),
                "--runs",
                str(args.runs),
                "--artifacts",
                str(args.artifacts),
                "--corpus",
                str(corpus),
                "--seeds",
                str(seeds),
                *extra,
            ]
            files = Path(workdir) / "files"  # the log target's segment files
            files.mkdir()
            environment = {**os.environ, "TQBROKER_FUZZ_TMP": str(files)}
            done = subprocess.run(command, check=False, env=environment)
            status = done.returncode or status
    return status


def _confirm_slow(name: str) -> int:
    """Whether the input on stdin is over the budget without instrumentation (exit status 1)."""
    from tests.fuzz.common import SlowInput, check
    from tests.fuzz.targets import TARGETS, run_any

    function = run_any if name == "all" else TARGETS[name].run
    try:
        check(function, sys.stdin.buffer.read())
    except SlowInput as exc:
        print(f"confirmed without instrumentation: {exc}", file=sys.stderr)
        return 1
    return 0


def _fuzz(name: str, args: argparse.Namespace, extra: list[str]) -> int:
    """The child process: fuzz one target (or replay inputs); never returns."""
    import atheris

    with atheris.instrument_imports(include=["tqbroker", "fuzz"]):
        from tests.fuzz.common import BUDGET_S, SlowInput
        from tests.fuzz.targets import TARGETS, check, run_any

    function: Callable[[bytes], None]
    if name == "all":
        function, max_len = run_any, 1 + max(t.max_len for t in TARGETS.values())
    else:
        function, max_len = TARGETS[name].run, TARGETS[name].max_len

    def one(data: bytes) -> None:
        # Instrumented code runs 10-20 times slower: an input over the budget here counts only
        # if it is over it without the instrumentation too (checked in a fresh process).
        try:
            check(function, data, budget=BUDGET_S * INSTRUMENTED_SLOWDOWN)
        except SlowInput:
            confirm = [sys.executable, "-m", "tests.fuzz.run", "--confirm-slow", name]
            if subprocess.run(confirm, input=data, check=False).returncode:
                raise

    replay = [*args.targets, *(e for e in extra if not e.startswith("-"))]  # files
    libfuzzer = [
        sys.argv[0],
        f"-max_len={max_len}",
        f"-artifact_prefix={args.artifacts}/{name}-",
        "-timeout=10",
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
        *[e for e in extra if e.startswith("-")],
    ]
    if replay:
        libfuzzer += replay
    else:
        libfuzzer += [
            f"-max_total_time={args.seconds}",
            f"-runs={args.runs}",
            str(args.corpus),
            str(args.seeds),
        ]
    atheris.Setup(libfuzzer, one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
