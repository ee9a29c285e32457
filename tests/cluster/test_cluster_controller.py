"""The controller's node killed with ``kill -9`` on a real three-node cluster (the design's
fault case 3): another node takes the controller key once the dead one's lease runs out and
does the controller's work; when the stream's leader is killed next, the last node standing
is elected (by a controller that is not the first), with every confirmed message, and takes
new publishes."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster_nodes import (
    POLL,
    Nodes,
    declare_stream,
    publish,
    read_stream,
    three_nodes,
    wait_record,
)
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually


def wait_controller(nodes: Nodes, not_on: str, timeout: float = 60) -> str:
    def moved() -> str | None:
        found = nodes.controller()
        return found if found is not None and found != not_on else None

    return eventually(
        moved,
        timeout,
        POLL,
        what=f"a controller other than {not_on!r}",
    )


def test_controllers_after_the_first_elect_leaders(tmp_path: Path, etcd: EtcdProcess) -> None:
    with three_nodes(tmp_path, etcd) as nodes:
        first = wait_controller(nodes, not_on="")
        # One in-sync replica suffices: the last node standing may still take publishes.
        declare_stream(nodes.running["n1"], arguments={"x-stream-min-insync-replicas": 1})
        record = wait_record(nodes, lambda r: r.leader is not None and len(r.isr) == 3)
        bodies = [b"m%d" % n for n in range(40)]
        publish(nodes.running["n1"], bodies)
        nodes.running.pop(first).kill()
        wait_controller(nodes, not_on=first)
        record = wait_record(nodes, lambda r: r.leader in nodes.running)
        assert record.leader is not None
        nodes.running.pop(record.leader).kill()  # a controller other than the first elects
        (survivor,) = nodes.running
        final = wait_record(nodes, lambda r: r.leader == survivor)
        assert final.epoch > record.epoch
        process = nodes.running[survivor]
        assert read_stream(process, 40) == bodies
        publish(process, [b"after"])
        assert read_stream(process, 41) == [*bodies, b"after"]
