"""The ``broker`` fixture: each admin-tool test against tqbroker, then against the oracle RabbitMQ
(``rabbitmq_oracle``; skipped without it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.testing import running_broker

from .brokers import Broker


@pytest.fixture(
    scope="module",
    params=["tqbroker", "rabbitmq"],
)
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """Each test runs against tqbroker, then against RabbitMQ (skipped without it)."""
    if request.param == "tqbroker":
        with running_broker() as running:
            url = running.http_url.replace("http://", "http://guest:guest@")
            yield Broker("tqbroker", url, running.url)
        return
    rabbit: RabbitMQ = request.getfixturevalue("rabbitmq_oracle")  # skips without RabbitMQ
    url = rabbit.http_url.replace("http://", "http://guest:guest@")
    yield Broker("rabbitmq", url, rabbit.url)
