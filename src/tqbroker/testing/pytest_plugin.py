"""pytest fixtures for tests that need a real broker (registered as a ``pytest11`` plugin).

- ``tqbroker_broker``: a broker on an ephemeral port inside the test's Trio nursery (pytest-trio);
- ``tqbroker_thread``: a broker in a background thread, for synchronous tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from ..config import BrokerConfig
from . import RunningBroker, running_broker, start_broker


@pytest.fixture
async def tqbroker_broker(tmp_path: Path) -> AsyncIterator[RunningBroker]:
    async with trio.open_nursery() as nursery:
        config = BrokerConfig(port=0, data_dir=tmp_path / "data")
        yield await start_broker(nursery, config)
        nursery.cancel_scope.cancel()


@pytest.fixture
def tqbroker_thread() -> Iterator[RunningBroker]:
    with running_broker() as broker:
        yield broker
