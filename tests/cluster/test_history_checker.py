"""The cluster checker (``tests/support/cluster_history.py``) can fail: a clean history passes,
and each invariant's violation is reported by name."""

from __future__ import annotations

import pytest

from tests.support.cluster_history import (
    CONFIRMED,
    NACKED,
    UNKNOWN,
    History,
    Publish,
    Replica,
    check,
    payload_of,
)


def replica(node: str, payloads: list[bytes], high_watermark: int | None = None) -> Replica:
    hw = len(payloads) if high_watermark is None else high_watermark
    return Replica(node, "p0", dict(enumerate(payloads)), payloads[:hw], hw)


def clean() -> History:
    log = [payload_of("a", n) for n in range(5)]
    history = History()
    history.publishes = [Publish("a", n, "p0", CONFIRMED) for n in range(5)]
    history.deliveries = [("c", "p0", n, log[n]) for n in range(5)]
    history.watermarks = [("c", "p0", 1), ("c", "p0", 5)]
    history.appends = [("n0", "p0", 1), ("n1", "p0", 2)]
    history.replicas = [replica("n0", log), replica("n1", log), replica("n2", log[:3])]
    return history


def test_a_clean_history_passes() -> None:
    assert check(clean()) == []


def test_a_nacked_or_unknown_publish_may_be_missing() -> None:
    history = clean()
    history.publishes += [Publish("a", 5, "p0", NACKED), Publish("a", 6, "p0", UNKNOWN)]
    assert check(history) == []


@pytest.mark.parametrize(
    ("spoil", "found"),
    [
        (lambda h: h.publishes.append(Publish("a", 9, "p0", CONFIRMED)), "lost confirm"),
        (lambda h: h.replicas[1].records.update({2: b"x"}), "lost confirm"),
        (lambda h: h.deliveries.append(("c", "p0", 1, b"other")), "phantom read"),
        (lambda h: h.deliveries.append(("c", "p0", 1, b"other")), "holds 2 payloads"),
        (lambda h: h.watermarks.append(("c", "p0", 3)), "went back"),
        (lambda h: h.appends.append(("n2", "p0", 2)), "two writers"),
        (lambda h: h.replicas[2].frames.__setitem__(1, b"x"), "replicas differ"),
    ],
)
def test_each_violation_is_found(spoil: object, found: str) -> None:
    history = clean()
    spoil(history)  # type: ignore[operator]
    violations = check(history)
    assert any(found in v for v in violations), violations


def test_reordered_and_duplicated_publishes_are_found() -> None:
    history = clean()
    swapped = [payload_of("a", n) for n in (0, 2, 1, 3, 4)]
    history.replicas = [replica("n0", swapped)]
    history.deliveries = []
    assert any("reordered" in v for v in check(history))
    history = clean()
    doubled = [payload_of("a", n) for n in (0, 1, 2, 3, 4, 4)]
    history.replicas = [replica("n0", doubled)]
    history.deliveries = []
    assert any("duplicate" in v for v in check(history))
    history.publishes[4].resent = True  # after an unknown outcome: allowed
    assert check(history) == []
