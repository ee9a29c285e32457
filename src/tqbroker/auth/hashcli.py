"""``python -m tqbroker hash-password [--algorithm NAME]``: a password (from stdin, or asked
for without echo on a terminal) printed as a RabbitMQ-format hash for a config file's
``password_hash`` or a definitions file."""

from __future__ import annotations

import argparse
import getpass
import sys

from .passwords import ALGORITHMS, DEFAULT_ALGORITHM, hash_password


def main(argv: list[str], prog: str = "python -m tqbroker hash-password") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument(
        "--algorithm",
        choices=sorted(ALGORITHMS),
        default=DEFAULT_ALGORITHM,
        help=f"the hashing_algorithm (default {DEFAULT_ALGORITHM})",
    )
    args = parser.parse_args(argv)
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print(f"{prog}: the passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print(
            f"{prog}: an empty password (a user without one logs in by EXTERNAL only)",
            file=sys.stderr,
        )
        return 1
    print(hash_password(password, args.algorithm))
    return 0
