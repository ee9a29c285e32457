"""Shared test fixtures. The broker fixtures come from tqbroker's pytest plugin
(``tqbroker_broker`` for Trio tests, ``tqbroker_thread`` for synchronous clients) and from
``tests.support.brokers`` (``make_broker(**settings)``, a broker with its own configuration);
``channel`` is a pika channel on ``tqbroker_thread``, ``http`` an httpx client of its HTTP API
logged in as guest."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pika
import pytest
from hypothesis import settings
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.store import LogQueueStore
from tqbroker.backends.log.stream import LogStream
from tqbroker.testing import RunningBroker

# ``rabbitmq_oracle``: a real RabbitMQ to compare with; ``make_broker``.
pytest_plugins = ["tests.support.rabbitmq_oracle", "tests.support.brokers"]

# No per-example deadline (Hypothesis' default is 200 ms): on a loaded 2-core machine an
# example is sometimes that slow once, which is no bug. Time budgets that matter (the fuzz
# targets') are checked by the tests themselves.
settings.register_profile("tqbroker", deadline=None)
settings.load_profile("tqbroker")


@pytest.fixture
def channel(tqbroker_thread: RunningBroker) -> Iterator[BlockingChannel]:
    """A pika channel on a fresh broker (its connection closed afterwards)."""
    connection = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    yield connection.channel()
    if connection.is_open:
        connection.close()


@pytest.fixture
def http(tqbroker_thread: RunningBroker) -> Iterator[httpx.Client]:
    """An httpx client of the test broker's HTTP API, logged in as guest."""
    with httpx.Client(
        base_url=tqbroker_thread.http_url, auth=("guest", "guest"), timeout=10
    ) as client:
        yield client


@pytest.fixture(autouse=True)
def log_stores_say_when_they_change(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every log-backend flush in every test checks that each store with work to do had said
    so (``Log.changed``): a flush covers only those, so one that did not would go unflushed."""
    unmarked: list[str] = []
    take_changed = LogBackend._take_changed

    def checked(backend: LogBackend) -> dict[LogQueueStore | LogStream, None]:
        changed = take_changed(backend)
        missing = [s for s in backend._stores() if s.needs_flush and s not in changed]
        unmarked.extend(str(s.directory) for s in missing)
        return changed

    monkeypatch.setattr(LogBackend, "_take_changed", checked)
    yield
    assert not unmarked, f"stores with work to flush that never said so: {unmarked[:5]}"
