"""Helpers for testing code against a real tqbroker.

- ``running_broker()``: a context manager that runs a broker in a background thread on an
  ephemeral port, for synchronous code (pika's BlockingConnection, kombu, Celery);
- ``start_broker(nursery)``: start a broker inside a Trio nursery you own;
- the pytest plugin (``tqbroker.testing.pytest_plugin``, loaded automatically when tqbroker is
  installed) offers the fixtures ``tqbroker_broker`` (pytest-trio) and ``tqbroker_thread``.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio

from ..config import BrokerConfig
from ..server.listener import serve


@attrs.frozen
class RunningBroker:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"


DURABLE_BACKEND_ENV = "TQBROKER_TEST_DURABLE_BACKEND"


def durable_backend_for_tests() -> str:
    """The durable backend test brokers use: ``$TQBROKER_TEST_DURABLE_BACKEND`` or ``log``
    (so one test suite runs against every backend: ``nox -s "backends(backend='rocksdb')"``)."""
    return os.environ.get(DURABLE_BACKEND_ENV) or BrokerConfig().durable_backend


def _isolated(config: BrokerConfig | None, data_dir: str) -> BrokerConfig:
    """Port 0 by default, and a private data directory unless ``config`` names one: a test
    broker never reads or writes ``./tqbroker-data``. The durable backend follows
    ``durable_backend_for_tests()`` unless ``config`` chose one."""
    defaults = BrokerConfig()
    config = config or BrokerConfig(port=0)
    if config.data_dir == defaults.data_dir:
        config = attrs.evolve(config, data_dir=Path(data_dir))
    if config.durable_backend == defaults.durable_backend:
        config = attrs.evolve(config, durable_backend=durable_backend_for_tests())
    return config


async def start_broker(nursery: trio.Nursery, config: BrokerConfig | None = None) -> RunningBroker:
    """Start a broker (port 0 unless ``config`` says otherwise) in ``nursery``, with a fresh
    temporary data directory unless ``config`` names one."""
    config = _isolated(config, tempfile.mkdtemp(prefix="tqbroker-test-"))
    addresses = await nursery.start(lambda task_status: serve(config, task_status=task_status))
    host, port = addresses[0]
    return RunningBroker(host, port)


@contextmanager
def running_broker(config: BrokerConfig | None = None) -> Iterator[RunningBroker]:
    """Run a broker in a background thread for the duration of the ``with`` block (port 0 and
    a temporary data directory, removed afterwards, unless ``config`` says otherwise)."""
    with (
        tempfile.TemporaryDirectory(prefix="tqbroker-test-") as data_dir,
        _run_in_thread(_isolated(config, data_dir)) as broker,
    ):
        yield broker


@contextmanager
def _run_in_thread(config: BrokerConfig) -> Iterator[RunningBroker]:
    started: queue.Queue[RunningBroker | BaseException] = queue.Queue()
    stop: list[trio.Event] = []
    token: list[trio.lowlevel.TrioToken] = []

    async def main() -> None:
        shutdown = trio.Event()
        stop.append(shutdown)
        token.append(trio.lowlevel.current_trio_token())
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(
                lambda task_status: serve(config, shutdown=shutdown, task_status=task_status)
            )
            started.put(RunningBroker(*addresses[0]))

    def thread_main() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the waiting caller
            started.put(exc)

    thread = threading.Thread(target=thread_main, name="tqbroker", daemon=True)
    thread.start()
    result = started.get(timeout=30)
    if isinstance(result, BaseException):
        raise RuntimeError("the broker failed to start") from result
    try:
        yield result
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=token[0])
        thread.join(timeout=30)


__all__ = ["RunningBroker", "durable_backend_for_tests", "running_broker", "start_broker"]
