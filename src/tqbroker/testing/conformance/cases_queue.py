"""Conformance cases: one queue's contract (ids, order, requeue, ack, purge, counts, ``peek``,
``ready_bytes``)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

from .harness import (
    NEVER_ISSUED_ID,
    BackendFactory,
    BackendHarness,
    CaseList,
    assert_counts,
    assert_flushed,
    assert_peek_then_pop,
    assert_popped,
    assert_ready_bytes,
    make_message,
    numbered,
)

log = logging.getLogger(__name__)

QUEUE_CASES = CaseList()
"""This module's cases, in the order they run."""
_case = QUEUE_CASES.case


@_case()
def check_open_creates_missing_dir(factory: BackendFactory, data_dir: Path) -> None:
    """``open`` accepts a missing directory (a durable backend creates it); a fresh backend is
    healthy and empty, and after a flush nothing is pending."""
    target = data_dir / "missing" / "nested"
    with BackendHarness(factory, target) as h:
        if h.durable:
            assert target.is_dir(), "a durable backend's open() did not create data_dir"
        assert h.backend.healthy, "a freshly opened backend is not healthy"
        store = h.queue()
        assert_counts(store, 0, 0, "for a new queue")
        assert h.pop(store) is None, "pop() on a new queue returned a message"
        h.flush()
        assert_flushed(h.backend)


@_case()
def check_ids_increase(factory: BackendFactory, data_dir: Path) -> None:
    """``push`` returns strictly increasing ids, also after pops, acks, requeues and purges."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        ids = [store.push(numbered(n), persistent=n % 2 == 0) for n in range(50)]
        assert all(isinstance(i, int) for i in ids), "push() must return int ids"
        assert ids == sorted(set(ids)), f"push() ids are not strictly increasing: {ids}"
        popped = [h.pop(store) for _ in range(10)]
        for n, item in enumerate(popped):
            assert item is not None
            if n % 2:
                store.ack(item[0])
            else:
                store.requeue(item[0])
        store.purge()
        more = [store.push(numbered(n), persistent=True) for n in range(50, 60)]
        assert more == sorted(set(more)), f"push() ids are not strictly increasing: {more}"
        assert more[0] > ids[-1], (
            f"an id was reused: {more[0]} after {ids[-1]} (following pops, acks and a purge)"
        )


@_case()
def check_pop_order(factory: BackendFactory, data_dir: Path) -> None:
    """``pop`` hands out ready messages in id order, unflagged, each once; then ``None``."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [numbered(n) for n in range(20)]
        ids = [store.push(m, persistent=n % 3 != 0) for n, m in enumerate(messages)]
        assert_counts(store, 20, 0, "after 20 pushes")
        for n, (message_id, message) in enumerate(zip(ids, messages, strict=True)):
            assert_popped(h.pop(store), message_id, message, False)
            assert_counts(store, 19 - n, n + 1, f"after {n + 1} pops")
        assert h.pop(store) is None, "pop() returned a message from an exhausted queue"
        assert_counts(store, 0, 20, "after popping everything")


@_case()
def check_requeue_order(factory: BackendFactory, data_dir: Path) -> None:
    """Requeued messages come back before newer ones, in id order whatever the requeue order,
    flagged redelivered; the flag sticks across further requeues."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [numbered(n) for n in range(6)]
        ids = [store.push(m, persistent=True) for m in messages]
        for n in range(4):
            assert_popped(h.pop(store), ids[n], messages[n], False)
        store.requeue(ids[2])
        store.requeue(ids[0])
        assert_counts(store, 4, 2, "after requeueing 2 of 4 unacked")
        late = numbered(6)
        late_id = store.push(late, persistent=True)
        assert_popped(h.pop(store), ids[0], messages[0], True)
        store.requeue(ids[0])  # back again, still ahead of everything
        assert_popped(h.pop(store), ids[0], messages[0], True)
        assert_popped(h.pop(store), ids[2], messages[2], True)
        assert_popped(h.pop(store), ids[4], messages[4], False)
        store.requeue(ids[3])  # older than the remaining ready ones
        assert_popped(h.pop(store), ids[3], messages[3], True)
        assert_popped(h.pop(store), ids[5], messages[5], False)
        assert_popped(h.pop(store), late_id, late, False)
        assert h.pop(store) is None
        assert_counts(store, 0, 7, "with everything delivered")


@_case()
def check_ack_removes(factory: BackendFactory, data_dir: Path) -> None:
    """``ack`` forgets an unacked message for good: it is neither counted nor handed out."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [numbered(n) for n in range(4)]
        ids = [store.push(m, persistent=True) for m in messages]
        for message_id, message in zip(ids[:3], messages[:3], strict=True):
            assert_popped(h.pop(store), message_id, message, False)
        store.ack(ids[1])
        assert_counts(store, 1, 2, "after acking 1 of 3 unacked")
        store.requeue(ids[1])  # acked: unknown now
        assert_counts(store, 1, 2, "after requeueing an acked id")
        store.ack(ids[0])
        store.ack(ids[2])
        assert_counts(store, 1, 0, "after acking every unacked message")
        assert_popped(h.pop(store), ids[3], messages[3], False)
        store.ack(ids[3])
        assert_counts(store, 0, 0, "after acking everything")
        assert h.pop(store) is None, "an acked message came back"


@_case()
def check_unknown_ids_ignored(factory: BackendFactory, data_dir: Path) -> None:
    """``ack`` and ``requeue`` ignore ids never issued, ids already acked, and ids issued by
    another queue's store."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue("q1")
        other = h.queue("q2")
        message = numbered(1)
        message_id = store.push(message, persistent=True)
        assert_popped(h.pop(store), message_id, message, False)
        for bogus in (NEVER_ISSUED_ID, NEVER_ISSUED_ID + 1):
            store.ack(bogus)
            store.requeue(bogus)
            assert_counts(store, 0, 1, f"after ack/requeue of never-issued id {bogus}")
        other.ack(message_id)  # an id of store, unknown to other
        other.requeue(message_id)
        assert_counts(store, 0, 1, "after ack/requeue of its id on another queue")
        assert_counts(other, 0, 0, "after ack/requeue of another queue's id")
        store.ack(message_id)
        store.ack(message_id)
        store.requeue(message_id)
        assert_counts(store, 0, 0, "after a double ack and a requeue of an acked id")
        assert h.pop(store) is None, "an acked message came back"


@_case()
def check_non_unacked_ids_ignored(factory: BackendFactory, data_dir: Path) -> None:
    """``ack`` and ``requeue`` act only on unacked messages: on a ready id (never delivered, or
    already requeued) they change nothing."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [numbered(n) for n in range(3)]
        ids = [store.push(m, persistent=True) for m in messages]
        store.ack(ids[2])  # ready, never delivered
        store.requeue(ids[2])
        assert_counts(store, 3, 0, "after ack/requeue of a never-delivered id")
        assert_popped(h.pop(store), ids[0], messages[0], False)
        store.requeue(ids[0])
        store.requeue(ids[0])  # already ready again
        assert_counts(store, 3, 0, "after requeueing the same id twice")
        store.ack(ids[0])  # ready (requeued), not unacked
        assert_counts(store, 3, 0, "after acking a requeued (ready) id")
        assert_popped(h.pop(store), ids[0], messages[0], True)
        assert_popped(h.pop(store), ids[1], messages[1], False)
        assert_popped(h.pop(store), ids[2], messages[2], False)
        assert h.pop(store) is None, "a message was handed out twice"
        assert_counts(store, 0, 3, "with everything delivered")


@_case()
def check_purge(factory: BackendFactory, data_dir: Path) -> None:
    """``purge`` drops every ready message (requeued ones included), keeps unacked ones and
    returns how many it dropped."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        assert store.purge() == 0, "purge() of an empty queue did not return 0"
        messages = [numbered(n) for n in range(6)]
        ids = [store.push(m, persistent=n % 2 == 0) for n, m in enumerate(messages)]
        for n in range(3):
            assert_popped(h.pop(store), ids[n], messages[n], False)
        store.requeue(ids[0])
        assert_counts(store, 4, 2, "before the purge")
        dropped = store.purge()
        assert dropped == 4, f"purge() returned {dropped}, expected 4 (3 ready + 1 requeued)"
        assert_counts(store, 0, 2, "after the purge")
        assert h.pop(store) is None, "a purged message came back"
        store.requeue(ids[0])  # purged: unknown now
        assert_counts(store, 0, 2, "after requeueing a purged id")
        store.requeue(ids[2])  # unacked ones survive the purge
        assert_counts(store, 1, 1, "after requeueing an unacked message kept by the purge")
        later = numbered(9)
        later_id = store.push(later, persistent=True)
        assert_popped(h.pop(store), ids[2], messages[2], True)
        assert_popped(h.pop(store), later_id, later, False)
        store.ack(ids[1])
        store.ack(ids[2])
        store.ack(later_id)
        assert_counts(store, 0, 0, "after acking everything")
        assert store.purge() == 0, "purge() of an empty queue did not return 0"


@_case()
def check_counts_track_a_mixed_workload(factory: BackendFactory, data_dir: Path) -> None:
    """``ready_count`` and ``unacked_count`` follow a seeded random mix of every operation
    (a deterministic cousin of the state machine)."""
    rng = random.Random(20240601)
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        ready = 0
        unacked: list[int] = []
        for step in range(400):
            op = rng.choice(("push", "push", "push", "pop", "pop", "ack", "requeue", "purge"))
            if op == "push":
                store.push(numbered(step), persistent=rng.random() < 0.5)
                ready += 1
            elif op == "pop":
                popped = h.pop(store)
                assert (popped is None) == (ready == 0), f"step {step}: pop() = {popped!r}"
                if popped is not None:
                    ready -= 1
                    unacked.append(popped[0])
            elif op in ("ack", "requeue") and unacked:
                message_id = unacked.pop(rng.randrange(len(unacked)))
                if op == "ack":
                    store.ack(message_id)
                else:
                    store.requeue(message_id)
                    ready += 1
            elif op == "purge" and rng.random() < 0.2:
                dropped = store.purge()
                assert dropped == ready, f"step {step}: purge() = {dropped}, expected {ready}"
                ready = 0
            assert_counts(store, ready, len(unacked), f"at step {step} ({op})")


@_case()
def check_peek(factory: BackendFactory, data_dir: Path) -> None:
    """``peek`` shows what ``pop`` returns next (id, message, redelivered) and changes nothing:
    not the counts, not ``ready_bytes``, not the order, however often it is called; requeued
    messages show first; ``None`` when nothing is ready, after a purge too."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        assert h.peek(store) is None, "peek() on a new queue returned a message"
        messages = [numbered(n) for n in range(6)]
        ids = [store.push(m, persistent=n % 2 == 0) for n, m in enumerate(messages)]
        for n in range(3):
            assert_peek_then_pop(h, store, ids[n], messages[n], False)
        store.requeue(ids[2])
        store.requeue(ids[0])
        assert_peek_then_pop(h, store, ids[0], messages[0], True)
        late = numbered(6)
        late_id = store.push(late, persistent=True)
        assert_peek_then_pop(h, store, ids[2], messages[2], True)
        assert_peek_then_pop(h, store, ids[3], messages[3], False)
        store.requeue(ids[1])  # older than everything ready
        assert_peek_then_pop(h, store, ids[1], messages[1], True)
        for n in (4, 5):
            assert_peek_then_pop(h, store, ids[n], messages[n], False)
        assert_peek_then_pop(h, store, late_id, late, False)
        assert h.peek(store) is None, "peek() returned a message from an exhausted queue"
        assert_counts(store, 0, 7, "with everything delivered")
        store.requeue(ids[3])
        store.push(numbered(7), persistent=True)
        assert store.purge() == 2
        assert h.peek(store) is None, "peek() returned a message after a purge"
        assert_counts(store, 0, 6, "after the purge")


@_case()
def check_ready_bytes(factory: BackendFactory, data_dir: Path) -> None:
    """``ready_bytes`` is the sum of the body lengths of the ready messages: pushes and requeues
    add to it, pops and purges take from it; acks (of unacked messages) and ack/requeue of
    unknown ids leave it alone; empty bodies count for nothing."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        assert_ready_bytes(store, 0, "for a new queue")
        bodies = [b"", b"x", b"0123456789", b"\x00" * 1000, b"b" * 65536, b"y" * 7]
        ids = [store.push(make_message(b), persistent=n % 2 == 1) for n, b in enumerate(bodies)]
        sizes = dict(zip(ids, map(len, bodies), strict=True))
        total = sum(sizes.values())
        assert_ready_bytes(store, total, "after the pushes")
        popped = [h.pop(store) for _ in range(5)]
        delivered = [item[0] for item in popped if item is not None]
        assert len(delivered) == 5
        assert_ready_bytes(store, sizes[ids[5]], "after popping all but the last")
        store.requeue(delivered[4])
        store.requeue(delivered[1])
        assert_ready_bytes(store, sizes[ids[5]] + sizes[ids[4]] + 1, "after two requeues")
        store.ack(delivered[3])
        store.ack(delivered[3])
        for unknown in (NEVER_ISSUED_ID, delivered[1]):  # never issued; ready, not unacked
            store.ack(unknown)
            store.requeue(unknown)
        assert_ready_bytes(store, sizes[ids[5]] + sizes[ids[4]] + 1, "after acks")
        assert store.purge() == 3
        assert_ready_bytes(store, 0, "after a purge")
        store.requeue(delivered[2])  # unacked: kept by the purge
        assert_ready_bytes(store, 10, "after requeueing a message the purge kept")
        assert_popped(h.pop(store), delivered[2], make_message(bodies[2]), True)
        assert_ready_bytes(store, 0, "after popping it again")
        store.ack(delivered[2])
        store.ack(delivered[0])
        assert_counts(store, 0, 0, "after acking everything")
        assert_ready_bytes(store, 0, "after acking everything")
