"""The garbage collector's policy (``broker/garbage.py``): a process taken over has small young
collections and no automatic full one; full collections come only under memory pressure, at
most one a minute; an embedded broker leaves its host's collector alone."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pika
import pytest
import trio
import trio.testing

from tqbroker.broker import garbage
from tqbroker.broker.garbage import FULL_EVERY, LOOK_EVERY, FullCollections
from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker


@pytest.fixture
def collector() -> Iterator[None]:
    """This process's collector as it was, afterwards."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def test_take_over_sets_the_policy(collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(garbage, "_taken_over", False)
    before = gc.get_freeze_count()
    garbage.take_over()
    assert garbage.taken_over()
    assert gc.get_threshold() == (garbage.YOUNG, garbage.MIDDLE, garbage.NEVER)
    assert gc.get_freeze_count() > before


def test_the_command_line_takes_over(tmp_path: Path) -> None:
    """``cli.main`` takes the process over before it runs the broker (as ``python -m
    tqbroker`` does): checked in a child process, with ``trio.run`` stopped at once."""
    script = (
        "import gc, sys, trio\n"
        "from tqbroker import cli\n"
        "from tqbroker.broker import garbage\n"
        "def stop(*args, **kwargs):\n"
        "    print(garbage.taken_over(), gc.get_threshold()); sys.exit(0)\n"
        "trio.run = stop\n"
        "cli.main(['--port', '0', '--data-dir', sys.argv[1]])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    expected = f"True {(garbage.YOUNG, garbage.MIDDLE, garbage.NEVER)}"
    assert done.stdout.strip() == expected


def test_an_embedded_broker_leaves_the_collector_alone(tmp_path: Path) -> None:
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    with running_broker(BrokerConfig(port=0, data_dir=tmp_path)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        connection.channel().queue_declare("q")
        connection.close()
        assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() == frozen


async def test_full_collections_only_under_pressure_once_a_minute(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pressed = False
    collected: list[float] = []

    def collect() -> int:
        collected.append(trio.current_time())
        return 0

    full = FullCollections(lambda: pressed, collect=collect)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(full.run)
        await trio.sleep(10 * FULL_EVERY)
        assert collected == []  # no pressure, no full collection
        pressed = True
        start = trio.current_time()
        await trio.sleep(3.5 * FULL_EVERY)
        assert len(collected) == 4, collected  # at once, then once a minute
        assert collected[0] - start <= LOOK_EVERY
        gaps = [b - a for a, b in pairwise(collected)]
        assert all(FULL_EVERY <= gap <= FULL_EVERY + LOOK_EVERY for gap in gaps), gaps
        pressed = False
        await trio.sleep(5 * FULL_EVERY)
        assert len(collected) == 4
        nursery.cancel_scope.cancel()
    assert full.collections == 4
