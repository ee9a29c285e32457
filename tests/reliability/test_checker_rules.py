"""The kill -9 checker's rules on hand-made histories: each violation it exists to find is
found, and what the rules allow passes."""

from __future__ import annotations

from .checker import History, check_queue, check_stream


def published(*ids: str, confirmed: bool = True, times: int = 1) -> History:
    h = History()
    for msg_id in ids:
        for _ in range(times):
            h.attempt(msg_id)
        if confirmed:
            h.confirm(msg_id, True)
    return h


def deliver(h: History, rnd: int, msg_id: str, redelivered: bool, durable: bool = False) -> None:
    h.round = rnd
    d = h.deliver("c0", msg_id, redelivered)
    d.acked = d.durable_ack = durable


def test_clean_queue_history_passes() -> None:
    h = published("p0-0", "p0-1")
    deliver(h, 0, "p0-0", False)  # acked, not durably: may come again, flagged
    deliver(h, 1, "p0-0", True, durable=True)
    deliver(h, 1, "p0-1", False, durable=True)
    c = check_queue(h)
    assert (c.lost, c.unexpected, c.duplicated, c.violations) == (0, 0, 1, [])


def test_lost_unexpected_and_recovered_are_counted() -> None:
    h = published("p0-0", "p0-1")
    h.attempt("p0-2")  # outcome unknown
    deliver(h, 0, "p0-1", False)
    deliver(h, 0, "p0-2", False)
    deliver(h, 0, "x-9", False)
    c = check_queue(h)
    assert (c.lost, c.unexpected, c.recovered) == (1, 1, 1)
    assert len(c.violations) == 2


def test_a_durably_acked_message_must_not_come_back() -> None:
    h = published("p0-0")
    deliver(h, 0, "p0-0", False, durable=True)
    deliver(h, 1, "p0-0", True)
    assert "after a durable ack" in check_queue(h).violations[0]
    h = published("p0-0", times=2)  # retried: two copies, each may be acked once
    deliver(h, 0, "p0-0", False, durable=True)
    deliver(h, 1, "p0-0", False, durable=True)
    assert not check_queue(h).violations


def test_a_repeat_must_be_flagged_unless_published_again() -> None:
    h = published("p0-0")
    deliver(h, 0, "p0-0", False)
    deliver(h, 1, "p0-0", False)
    assert "unflagged" in check_queue(h).violations[0]


def test_fresh_messages_of_a_sender_come_in_order() -> None:
    h = published("p0-0", "p0-1")
    deliver(h, 0, "p0-1", False)
    deliver(h, 0, "p0-0", False)
    assert "after p0-1" in check_queue(h).violations[0]


def stream(h: History, *ids: str) -> None:
    for offset, msg_id in enumerate(ids):
        h.final_image[offset].append(msg_id)


def test_clean_stream_history_passes() -> None:
    h = published("p0-0", "p0-1")
    stream(h, "p0-0", "p0-1")
    h.round = 0
    h.stream_read("r0", 0, "p0-0")
    h.round = 1  # resumed at last seen + 1 after a restart
    h.stream_read("r0", 1, "p0-1")
    c = check_stream(h)
    assert (c.lost, c.consumed, c.violations) == (0, 2, [])


def test_a_reader_that_saw_an_offset_reused_after_a_crash_is_caught() -> None:
    h = published("p0-0", "p1-0")
    stream(h, "p0-0", "p1-0")
    h.stream_read("r0", 0, "p1-0")  # read before the crash; the offset now holds another
    h.stream_read("r0", 1, "p1-0")
    violations = check_stream(h).violations
    assert "the stream holds p0-0 there" in violations[0]


def test_a_reader_that_skips_or_a_stream_with_a_gap_is_caught() -> None:
    h = published("p0-0", "p0-1", "p0-2")
    stream(h, "p0-0", "p0-1", "p0-2")
    h.stream_read("r0", 0, "p0-0")
    h.stream_read("r0", 2, "p0-2")
    assert "skipped to 2" in check_stream(h).violations[0]
    h = published("p0-0", "p0-1")
    h.final_image[0].append("p0-0")
    h.final_image[2].append("p0-1")
    assert "gaps at offsets [1]" in check_stream(h).violations[0]


def test_a_message_twice_in_the_stream_needs_two_publishes() -> None:
    h = published("p0-0")
    stream(h, "p0-0", "p0-0")
    assert "published 1x" in check_stream(h).violations[0]
    h = published("p0-0", times=2)
    stream(h, "p0-0", "p0-0")
    c = check_stream(h)
    assert (c.duplicated, c.violations) == (1, [])
