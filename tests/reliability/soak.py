"""The soak (issue 14, item 9): the kill -9 checker's clients for hours, the broker killed every
few minutes, its memory and descriptors printed as it goes, the history checked at the end.

    python -m tests.reliability.soak --minutes 120 --kill-every 180 [--backend log] [--seed N]

Not part of any test run (bounded only by ``--minutes``). It prints, every 10 s, the broker's
resident memory and open descriptors with the running totals, and at the end the checker's
counts (lost, unexpected, duplicated, recovered); it exits non-zero if the history breaks a
rule. A growing resident set or descriptor count across rounds is a leak.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from .test_kill9_checker import check, run_checker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=180.0, help="seconds per round")
    parser.add_argument("--backend", default="log", choices=["log", "rocksdb"])
    parser.add_argument("--seed", type=int, default=random.randrange(2**32))
    parser.add_argument("--data-dir", type=Path, help="default: a temporary directory")
    args = parser.parse_args()
    rounds = max(2, round(args.minutes * 60 / args.kill_every))
    rounds += rounds % 2  # the checker expects every other round to hold deliveries
    print(f"soak: {rounds} rounds of {args.kill_every:g} s on {args.backend}, seed {args.seed}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tqbroker-soak-") as tmp:
        data_dir = args.data_dir or Path(tmp)
        history = run_checker(
            data_dir, args.backend, rounds, args.seed, verbose=True, round_seconds=args.kill_every
        )
        try:
            check(history, rounds, args.seed, started)
        except AssertionError as exc:
            print(f"soak: FAILED: {exc}")
            return 1
    print("soak: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
