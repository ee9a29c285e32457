"""Fixtures of the reliability tests: one fork server per module, from which the model's
brokers are forked (``queue_model.ForkServer``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import pytest

from tests.support.queue_model import ForkServer


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    with closing(ForkServer()) as server:
        yield server
