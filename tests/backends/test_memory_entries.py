"""What a queued transient message costs the memory backend: no per-message id or tuple in the
ready deque (ids implied by position, still right across paging, requeues and purges), and one
shared object per distinct small property block."""

from __future__ import annotations

import random
from pathlib import Path

from tqbroker.backends.memory import MemoryQueueStore, Paging
from tqbroker.model import Message


def test_ids_stay_right_across_paging_requeues_and_purges(tmp_path: Path) -> None:
    paging = Paging()
    paging.directory, paging.window = tmp_path, 7
    store = MemoryQueueStore(paging)
    rng = random.Random(3)
    bodies: dict[int, bytes] = {}
    unacked: list[int] = []
    for step in range(3000):
        roll = rng.random()
        if roll < 0.5:
            body = b"%d" % step
            message_id = store.push(Message("", "q", b"\x00\x00", body))
            bodies[message_id] = body
        elif roll < 0.8:
            peeked = store.peek()
            got = store.pop()
            assert (peeked is None) == (got is None)
            if got is not None and peeked is not None:
                assert peeked[0] == got[0]
                assert peeked[1] is got[1]
                assert got[1].body == bodies[got[0]], f"id {got[0]} gave another message"
                unacked.append(got[0])
        elif roll < 0.9 and unacked:
            store.requeue(unacked.pop(rng.randrange(len(unacked))))
        elif roll < 0.99 and unacked:
            store.ack(unacked.pop(0))
        else:
            store.purge()
    store.close()


def test_equal_small_property_blocks_are_one_object() -> None:
    first = Message("", "q", bytes([0x10, 0x00, 0x01]), b"a")
    second = Message("", "q", bytes([0x10, 0x00, 0x01]), b"b")
    assert first.properties_raw is second.properties_raw
    big = bytes(200)
    assert Message("", "q", big, b"").properties_raw is big


def test_a_queued_entry_is_the_message_alone() -> None:
    store = MemoryQueueStore()
    for n in range(64):
        store.push(Message("", "q", b"\x00\x00", b"%d" % n))
    assert all(isinstance(entry, Message) for entry in store._ready)
