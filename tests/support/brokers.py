"""The ``make_broker`` fixture: ``make_broker(users=..., vhosts=...)`` starts a broker with that
configuration in a background thread (``tqbroker.testing.running_broker``: ephemeral ports, its
own data directory under the test's ``tmp_path``) and stops it after the test.

Without settings of their own, tests take ``tqbroker_thread`` (or ``tqbroker_broker`` in Trio);
a broker in a child process, to kill or restart, is ``tqbroker.testing.start_broker_process``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

MakeBroker = Callable[..., RunningBroker]


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[MakeBroker]:
    """A function of ``BrokerConfig`` settings returning a running broker (several may run)."""
    numbers = count()
    with ExitStack() as stack:

        def make(**settings: Any) -> RunningBroker:
            settings.setdefault("port", 0)
            settings.setdefault("data_dir", tmp_path / f"broker-{next(numbers)}")
            return stack.enter_context(running_broker(BrokerConfig(**settings)))

        yield make
