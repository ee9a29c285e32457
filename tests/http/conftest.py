"""The ``http`` fixture: an httpx client of the test broker's HTTP API, logged in as guest."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tqbroker.testing import RunningBroker


@pytest.fixture
def http(tqbroker_thread: RunningBroker) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=tqbroker_thread.http_url, auth=("guest", "guest"), timeout=10
    ) as client:
        yield client
