"""Developer tasks. ``nox`` runs lint, tests, backends and typecheck; ``nox -s tests -- -m slow``
runs the slow tests; ``nox -s generate`` regenerates the protocol module from the AMQP spec.

``tests``, ``backends`` and ``typecheck`` share one environment, ``.nox/dev``: the heavy test
dependencies (pyspark, pyarrow, pandas, celery, rocksdict) and mypy are installed once per run,
from ``requirements/dev.txt`` (this checkout's distributions, editable)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests", "backends", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

RUFF = "ruff==0.17.6"  # the same pin as the test extra: generated code is formatted with it
DEV_ENV = Path(__file__).resolve().parent / ".nox" / "dev"
_dev_env_ready = False  # pip has brought .nox/dev up to date during this run of nox
# The default sets run on two pytest-xdist workers, a test file each at a time: most of their
# time is spent waiting on brokers, clients and subprocesses, not on the CPU.
PARALLEL = ("-n", "2", "--dist", "loadfile")


def dev_env(session: nox.Session) -> tuple[str, dict[str, str]]:
    """The shared environment's interpreter and the variables to run it with: created when
    missing (by virtualenv, as nox makes its own, for the interpreter running nox), brought up
    to date by pip once per run."""
    global _dev_env_ready
    python = DEV_ENV / "bin" / "python"
    if not python.exists():
        session.run(sys.executable, "-m", "virtualenv", "--quiet", str(DEV_ENV), external=True)
    if not _dev_env_ready:
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        session.run(*pip, "-r", "requirements/dev.txt", external=True)
        _dev_env_ready = True
    path = os.pathsep.join([str(DEV_ENV / "bin"), os.environ.get("PATH", "")])
    return str(python), {"VIRTUAL_ENV": str(DEV_ENV), "PATH": path}


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite (slow tests excluded unless asked for with ``-- -m slow``); durable queues
    on the default ``log`` backend."""
    python, env = dev_env(session)
    # the 25 slowest tests are printed: the set must stay under 15 minutes on two cores
    args = session.posargs or ["-m", "not slow", "--durations=25", *PARALLEL]
    session.run(python, "-m", "pytest", "-p", "no:cacheprovider", *args, env=env, external=True)


@nox.session(venv_backend="none")
@nox.parametrize("backend", ["rocksdb"])
def backends(session: nox.Session, backend: str) -> None:
    """The client-facing and storage suites again with durable queues on another backend."""
    python, env = dev_env(session)
    args = session.posargs or [
        *("-m", "not slow", *PARALLEL),
        *("tests/interop", "tests/storage", "tests/plugins"),
    ]
    env["TQBROKER_TEST_DURABLE_BACKEND"] = backend
    session.run(python, "-m", "pytest", "-p", "no:cacheprovider", *args, env=env, external=True)


@nox.session(venv_backend="none")
def mutants(session: nox.Session) -> None:
    """The curated mutation session (``tools/mutants.py``; the mutants are in
    ``tools/mutant_list.py``): each mutant applied to a temporary copy of ``src/``, its tests run
    against it; a table of killed and survived (``-- --area storage``, ``-- --only ID``,
    ``-- --list``). ``pytest -m slow tests/mutation`` runs the same list as tests."""
    python, env = dev_env(session)
    session.run(python, "tools/mutants.py", *session.posargs, env=env, external=True)


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, the sibling distributions, tools, examples and
    benchmarks, and over the tests (every body checked, annotations optional: pyproject's
    ``tests.*`` override); then the layer contracts of ``.importlinter`` (import-linter)."""
    python, env = dev_env(session)
    session.run(python, "-m", "mypy", env=env, external=True)
    session.run(str(DEV_ENV / "bin" / "lint-imports"), env=env, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def generate(session: nox.Session) -> None:
    """Regenerate src/tqbroker/protocol/methods.py from the AMQP 0-9-1 spec file."""
    session.install(RUFF)
    session.run("python", "tools/gen_protocol.py")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite against RabbitMQ (started on loopback when installed; tqbroker alone
    otherwise), a table of medians per generator mode, both modes unless ``--mode`` is given
    (prints numbers; asserts nothing): ``nox -s bench``, ``nox -s bench -- --smoke``,
    ``nox -s bench -- --rabbitmq-url amqp://... --json out.json``. See docs/performance.md."""
    session.install("-r", "requirements/broker.txt")
    mode = [] if any(a.startswith("--mode") for a in session.posargs) else ["--mode", "both"]
    session.run("python", "benchmarks/suite.py", *mode, *session.posargs)


@nox.session(name="bench-storage")
def bench_storage(session: nox.Session) -> None:
    """Storage benchmarks against the disk's own limits (print numbers; assert nothing):
    ``nox -s bench-storage -- --queued 1000000``."""
    session.install("-e", ".")
    session.run("python", "benchmarks/storage.py", *session.posargs)


@nox.session(name="bench-delayed")
def bench_delayed(session: nox.Session) -> None:
    """Delayed delivery with 100,000 pending (prints lateness; asserts nothing):
    ``nox -s bench-delayed -- --durable-backend rocksdb``."""
    siblings = ["-e", "plugins/delayed_message", "-e", "backends/rocksdb"]
    session.install("-e", ".[delayed-message,rocksdb]", *siblings, "pika>=1.3")
    session.run("python", "benchmarks/delayed.py", *session.posargs)


@nox.session(name="bench-streams")
def bench_streams(session: nox.Session) -> None:
    """Stream publish (confirmed) and read-from-first rates, 1M messages of 100 bytes (prints
    msg/s; asserts nothing): ``nox -s bench-streams -- --count 100000``."""
    session.install("-e", ".")
    session.run("python", "benchmarks/streams.py", *session.posargs)


@nox.session(name="bench-spark")
def bench_spark(session: nox.Session) -> None:
    """The Spark data source: batch read and sink rates, 1M records of 100 bytes, in a local
    SparkSession (prints rows/s; asserts nothing; needs Java 17+):
    ``nox -s bench-spark -- --count 100000``."""
    session.install("-e", ".[spark]")
    session.run("python", "benchmarks/spark.py", *session.posargs)
