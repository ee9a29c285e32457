"""A node's id is its data directory's (``cluster/membership.load_node_id``): written once, durably
(a power cut right after the first start must not give the node another identity: its replicas
would be strangers to their ISRs), and a ``--node-id`` that differs from the stored one refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sim_disk import SimDisk
from tqbroker.cluster.membership import NodeIdError, load_node_id
from tqbroker.storage_env import StorageEnv


@pytest.mark.parametrize("wanted", [None, "n7"], ids=["generated", "given"])
def test_a_node_id_survives_a_power_cut_right_after_it_is_written(
    tmp_path: Path, wanted: str | None
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    disk = SimDisk(data)
    node_id = load_node_id(data, wanted, StorageEnv.default(disk))
    disk.after_power_cut(disk.crash_point())  # every byte not fsync'd is gone
    assert load_node_id(data, None) == node_id


def test_another_node_id_for_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    assert load_node_id(tmp_path, "n1") == "n1"
    with pytest.raises(NodeIdError, match="belongs to node 'n1'"):
        load_node_id(tmp_path, "n2")
