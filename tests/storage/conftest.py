"""Fixtures of the storage tests: a real tmpfs to fill up, brokers killed before it is
unmounted."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tqbroker.testing import BrokerProcess


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def brokers(tmpfs: Path, tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Started brokers, killed at the end (before the tmpfs is unmounted)."""
    started: list[BrokerProcess] = []
    yield started
    for broker in started:
        broker.kill()
