"""Fixtures of the cluster tests: ``etcd``, a real etcd (Debian's ``etcd-server``) on
ephemeral loopback ports in a temporary directory, stopped after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.etcd import EtcdProcess, running_etcd, system_etcd_binary


@pytest.fixture
def etcd() -> Iterator[EtcdProcess]:
    binary = system_etcd_binary()
    if binary is None:
        pytest.skip("no etcd: apt-get install etcd-server")
    with running_etcd(binary) as process:
        yield process
