"""The ``broker`` fixture: each admin-tool test against tqbroker, then RabbitMQ (``brokers.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tqbroker.testing import running_broker

from .brokers import RABBITMQ_SERVER, Broker, rabbitmq


@pytest.fixture(
    scope="module",
    # A RabbitMQ node takes ~30 s to start and stop here: its variant is in the slow set.
    params=["tqbroker", pytest.param("rabbitmq", marks=pytest.mark.slow)],
)
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """Each test runs against tqbroker, then against RabbitMQ (skipped without it)."""
    if request.param == "tqbroker":
        with running_broker() as running:
            url = running.http_url.replace("http://", "http://guest:guest@")
            yield Broker("tqbroker", url, running.url)
        return
    if not Path(RABBITMQ_SERVER).exists():
        pytest.skip("RabbitMQ is not installed (Debian package rabbitmq-server)")
    with rabbitmq() as rabbit:
        yield rabbit
