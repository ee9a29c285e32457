"""The definitions catalog's three-way merge, as a property: nodes that change their own
definitions and merge with a shared store (etcd's entries, written by compare-and-swap) in any
interleaving end with the same definitions, and a change is never lost unless another node
changed the same entry first; and a definitions document's entries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tqbroker.cluster.catalog_merge import entries, merge

KEYS = ["a", "b", "c"]
VALUES = [b"1", b"2", None]


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[int, str, str, bytes | None]]:
    steps: list[tuple[int, str, str, bytes | None]] = []
    for _ in range(draw(st.integers(0, 25))):
        node = draw(st.integers(0, 2))
        if draw(st.booleans()):
            steps.append((node, "sync", "", None))
        else:
            steps.append(
                (node, "change", draw(st.sampled_from(KEYS)), draw(st.sampled_from(VALUES)))
            )
    return steps


def sync(
    node: int,
    bases: list[dict[str, bytes]],
    locals_: list[dict[str, bytes]],
    cluster: dict[str, bytes],
) -> None:
    result = merge(bases[node], locals_[node], cluster)
    for key, value in result.to_cluster.items():
        if value is None:
            cluster.pop(key, None)
        else:
            cluster[key] = value
    for key, value in result.to_local.items():
        if value is None:
            locals_[node].pop(key, None)
        else:
            locals_[node][key] = value
    bases[node] = dict(cluster)
    assert locals_[node] == cluster


@given(runs())
def test_nodes_converge_after_syncing(steps: list[tuple[int, str, str, bytes | None]]) -> None:
    bases: list[dict[str, bytes]] = [{}, {}, {}]
    locals_: list[dict[str, bytes]] = [{}, {}, {}]
    cluster: dict[str, bytes] = {}
    for node, action, key, value in steps:
        if action == "sync":
            sync(node, bases, locals_, cluster)
        elif value is None:
            locals_[node].pop(key, None)
        else:
            locals_[node][key] = value
    for node in range(3):
        sync(node, bases, locals_, cluster)
    for node in range(3):
        sync(node, bases, locals_, cluster)
        assert locals_[node] == cluster


def test_a_change_made_alone_reaches_the_cluster() -> None:
    result = merge({"a": b"1"}, {"a": b"2", "b": b"3"}, {"a": b"1"})
    assert result.to_cluster == {"a": b"2", "b": b"3"}
    assert result.to_local == {}
    result = merge({"a": b"1"}, {}, {"a": b"1"})  # deleted here
    assert result.to_cluster == {"a": None}


def test_the_cluster_s_change_wins_a_conflict() -> None:
    result = merge({"a": b"1"}, {"a": b"2"}, {"a": b"3"})
    assert result.to_local == {"a": b"3"}
    assert result.to_cluster == {}
    result = merge({"a": b"1"}, {"a": b"1"}, {})  # deleted elsewhere
    assert result.to_local == {"a": None}


def test_a_document_s_entries() -> None:
    document = {
        "vhosts": [{"name": "/"}],
        "queues": [
            {"name": "q", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}},
            {"name": "t", "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}},
        ],
        "exchanges": [{"name": "x", "vhost": "/", "type": "topic", "durable": True}],
        "bindings": [
            {
                "source": "x",
                "vhost": "/",
                "destination": "q",
                "destination_type": "queue",
                "routing_key": "a.*",
                "arguments": {},
            },
            {
                "source": "x",
                "vhost": "/",
                "destination": "q",
                "destination_type": "queue",
                "routing_key": "a.*",
                "arguments": {"k": 1},
            },
        ],
    }
    found = entries(document)
    assert "defs/vhosts/%2F" in found
    assert "defs/%2F/queues/q" in found
    assert "defs/%2F/queues/t" not in found  # transient: not the cluster's
    assert "defs/%2F/exchanges/x" in found
    assert len([k for k in found if "/bindings/" in k]) == 2  # the arguments tell them apart
