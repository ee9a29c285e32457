"""Conformance cases: the flush protocol, clean restarts and simulated crashes.

Over 400 lines as one job: the durability cases of the conformance suite, each a short
function; they share the recovery assertions at the top.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ...backends.base import FLUSH_FIRST, Popped, QueueStore
from ...model import Message
from .harness import (
    T0_MS,
    BackendFactory,
    BackendHarness,
    CaseList,
    assert_counts,
    assert_flushed,
    assert_message,
    assert_peek_then_pop,
    assert_popped,
    assert_ready_bytes,
    body_bytes,
    make_message,
    numbered,
)

log = logging.getLogger(__name__)

DURABILITY_CASES = CaseList()
"""This module's cases, in the order they run."""
_case = DURABILITY_CASES.case


@_case()
def check_flush_protocol(factory: BackendFactory, data_dir: Path) -> None:
    """``begin_flush`` returns ``None`` when nothing is pending; a durable backend needs a
    flush after a persistent push and no longer once the flush work has run; the backend stays
    healthy. A non-durable backend never needs a flush."""
    with BackendHarness(factory, data_dir) as h:
        backend = h.backend
        h.flush()
        assert_flushed(backend)
        store = h.queue()
        for n in range(3):
            store.push(numbered(n), persistent=True)
            if h.durable:
                assert backend.needs_flush, "needs_flush is false after a persistent push"
                work = backend.begin_flush()
                assert work is not None, "begin_flush() returned None after a persistent push"
                work()
            else:
                assert not backend.needs_flush, "a non-durable backend reports needs_flush"
                assert not store.wants_flush, "a non-durable backend's store wants a flush"
                assert backend.begin_flush() is None, "a non-durable backend has flush work"
            assert backend.healthy, "the backend is unhealthy after a successful flush"
            assert_flushed(backend)
        popped = h.pop(store)
        assert popped is not None
        store.ack(popped[0])
        store.purge()
        h.flush()
        assert_flushed(backend)
        assert backend.healthy


@_case("durable")
def check_flush_covers_only_what_it_began_with(factory: BackendFactory, data_dir: Path) -> None:
    """A flush covers what was written before ``begin_flush``: a push between ``begin_flush``
    and the end of its work still needs a later flush."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        store.push(numbered(1), persistent=True)
        work = h.backend.begin_flush()
        assert work is not None, "begin_flush() returned None after a persistent push"
        store.push(numbered(2), persistent=True)  # the Trio thread goes on meanwhile
        work()
        assert h.backend.needs_flush, "a push made during a flush no longer needs a flush"
        assert h.flush(), "begin_flush() returned None for a push made during the last flush"
        assert_flushed(h.backend)


def _start_worker(work: Callable[[], None]) -> Callable[[], None]:
    """Run ``work`` in a thread, as the flusher does; the returned callable joins the thread and
    re-raises what ``work`` raised."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="conformance-flush-work")
    thread.start()

    def join() -> None:
        thread.join()
        if errors:
            raise errors[0]

    return join


@_case("durable")
def check_flush_work_runs_beside_other_calls(factory: BackendFactory, data_dir: Path) -> None:
    """The flush work runs in a worker thread while the broker's thread goes on pushing, popping,
    acking and requeueing; everything stays consistent and survives a clean restart."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        live: dict[int, Message] = {}
        for n in range(200):
            live[store.push(numbered(n), persistent=True)] = numbered(n)
        for _ in range(20):
            work = h.backend.begin_flush()
            join = _start_worker(work or (lambda: None))
            for n in range(10):
                message = numbered(1000 + n)
                live[store.push(message, persistent=True)] = message
                popped = store.pop()  # no flushing from this thread while the work runs
                if popped is not None and popped is not FLUSH_FIRST:
                    if n % 3:
                        store.ack(popped[0])
                        del live[popped[0]]
                    else:
                        store.requeue(popped[0])
            join()
            assert h.backend.healthy
        assert_counts(store, len(live), 0, "after the concurrent flushes")
        del store
        h.restart()
        store = h.queue()
        assert_counts(store, len(live), 0, "after a restart")
        for message_id, message, _redelivered in h.drain(store):
            assert_message(message, live.pop(message_id), f"message {message_id}")
        assert not live, f"messages lost: {sorted(live)}"


@_case("non-durable")
def check_restart_keeps_nothing(factory: BackendFactory, data_dir: Path) -> None:
    """A non-durable backend survives nothing: after a restart every queue is empty, whatever
    ``persistent`` said."""
    with BackendHarness(factory, data_dir) as h:
        for queue in ("a", "b"):
            store = h.queue(queue)
            for n in range(4):
                store.push(numbered(n), persistent=n % 2 == 0)
            h.pop(store)
        del store
        h.restart()
        for queue in ("a", "b"):
            store = h.queue(queue)
            assert_counts(store, 0, 0, f"for queue {queue!r} after a restart")
            assert h.pop(store) is None


def _assert_recovered(h: BackendHarness, store: QueueStore, expected: Sequence[Popped]) -> None:
    """After a restart: exactly ``expected`` are ready (their bodies make ``ready_bytes``),
    nothing is unacked, and they peek and pop in order with their ids, bytes and flags."""
    assert_counts(store, len(expected), 0, "after a restart")
    assert_ready_bytes(store, body_bytes(m for _, m, _ in expected), "after a restart")
    for message_id, message, redelivered in expected:
        assert_peek_then_pop(h, store, message_id, message, redelivered)
    assert h.peek(store) is None, "peek() shows a message after every expected one was popped"
    assert h.pop(store) is None, "more messages than expected after a restart"


@_case("durable")
def check_restart_recovers_persistent(factory: BackendFactory, data_dir: Path) -> None:
    """Flushed persistent messages are all back after a clean restart: ready, in order, with
    their ids, unflagged; in every queue."""
    with BackendHarness(factory, data_dir) as h:
        expected: dict[str, list[Popped]] = {}
        for queue in ("a", "b"):
            store = h.queue(queue)
            messages = [make_message(b"%s %d" % (queue.encode(), n)) for n in range(10)]
            expected[queue] = [(store.push(m, persistent=True), m, False) for m in messages]
        del store
        assert h.flush(), "begin_flush() returned None after persistent pushes"
        h.restart(flush=False)
        for queue in ("a", "b"):
            _assert_recovered(h, h.queue(queue), expected[queue])


@_case("durable")
def check_close_makes_durable(factory: BackendFactory, data_dir: Path) -> None:
    """``close`` makes everything durable: persistent messages never flushed are back after a
    clean restart."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [numbered(n) for n in range(5)]
        expected = [(store.push(m, persistent=True), m, False) for m in messages]
        del store
        h.restart(flush=False)
        _assert_recovered(h, h.queue(), expected)


@_case("durable")
def check_transient_dropped_on_restart(factory: BackendFactory, data_dir: Path) -> None:
    """Transient messages, ready or unacked, are gone after a restart; the persistent ones
    around them are back in order."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        pushed = [(store.push(numbered(n), persistent=n % 2 == 0), numbered(n)) for n in range(8)]
        for _ in range(3):
            h.pop(store)
        del store
        h.restart()
        expected = [(i, m, n < 3) for n, (i, m) in enumerate(pushed) if n % 2 == 0]
        _assert_recovered(h, h.queue(), expected)


def _push_flush_pop(
    h: BackendHarness, count: int, popped: int
) -> tuple[QueueStore, list[tuple[int, Message]]]:
    """On the default queue: push ``count`` numbered persistent messages, flush, pop the first
    ``popped``; return the store and the pushed ``(id, message)``s. The caller settles some and
    drops the store before a restart or crash."""
    store = h.queue()
    pushed = [(store.push(numbered(n), persistent=True), numbered(n)) for n in range(count)]
    h.flush()
    for _ in range(popped):
        h.pop(store)
    return store, pushed


@_case("durable")
def check_acked_gone_after_clean_restart(factory: BackendFactory, data_dir: Path) -> None:
    """Messages acked before a clean close (with or without a flush after the ack) do not come
    back; unacked ones do, flagged redelivered."""
    for flush_first in (True, False):
        with BackendHarness(factory, data_dir / f"flush-{flush_first}") as h:
            store, pushed = _push_flush_pop(h, 6, 4)
            store.ack(pushed[0][0])
            store.ack(pushed[2][0])
            del store
            h.restart(flush=flush_first)
            expected = [(pushed[n][0], pushed[n][1], n < 4) for n in (1, 3, 4, 5)]
            _assert_recovered(h, h.queue(), expected)


@_case("durable")
def check_redelivered_flag_after_restart(factory: BackendFactory, data_dir: Path) -> None:
    """After a restart, messages delivered before (unacked or requeued) come back flagged
    redelivered and never-delivered ones unflagged, all in id order; the flag survives a second
    restart."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        pushed = [(store.push(numbered(n), persistent=True), numbered(n)) for n in range(6)]
        for _ in range(4):
            h.pop(store)
        store.requeue(pushed[1][0])  # ready again, flagged
        store.requeue(pushed[3][0])
        h.pop(store)  # pushed[1] again: unacked
        del store
        h.restart()
        expected = [(i, m, n < 4) for n, (i, m) in enumerate(pushed)]
        store = h.queue()
        assert_counts(store, 6, 0, "after a restart")
        assert_popped(h.pop(store), *expected[0])
        del store
        h.restart()  # pushed[0] popped in both runs; the rest only in the first
        _assert_recovered(h, h.queue(), expected)


@_case("durable")
def check_ready_bytes_after_restart(factory: BackendFactory, data_dir: Path) -> None:
    """After a clean restart ``ready_bytes`` counts the persistent messages that came back,
    whether ready, requeued or unacked before, and not the transient ones; so again after a
    second restart with nothing flushed in between, and after one that follows a purge."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [
            make_message(b"m%d " % n + b"." * (100 * n), timestamp_ms=T0_MS + n) for n in range(10)
        ]
        ids = [store.push(m, persistent=n % 3 != 1) for n, m in enumerate(messages)]
        for _ in range(6):
            h.pop(store)
        store.ack(ids[0])
        store.requeue(ids[2])  # persistent
        store.requeue(ids[4])  # transient
        expected = [(ids[n], messages[n], n < 6) for n in range(1, 10) if n % 3 != 1]
        del store
        h.restart()
        store = h.queue()
        assert_counts(store, len(expected), 0, "after a restart")
        assert_ready_bytes(store, body_bytes(m for _, m, _ in expected), "after a restart")
        assert_peek_then_pop(h, store, *expected[0])  # unacked across the next restart
        del store
        h.restart(flush=False)
        store = h.queue()
        _assert_recovered(h, store, expected)  # all unacked now
        store.requeue(expected[1][0])
        store.push(make_message(b"purged"), persistent=True)
        assert store.purge() == 2
        del store
        h.restart(flush=False)
        back = [(i, m, True) for i, m, _ in expected if i != expected[1][0]]
        _assert_recovered(h, h.queue(), back)


@_case("durable")
def check_ids_not_reused_after_restart(factory: BackendFactory, data_dir: Path) -> None:
    """After a restart a push gets an id greater than every id issued before, even when the
    newest messages were transient, acked or purged (nothing survives to remember them by)."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        issued = [store.push(numbered(n), persistent=True) for n in range(3)]
        issued += [store.push(numbered(n), persistent=False) for n in range(3, 5)]
        del store
        h.restart()
        store = h.queue()
        issued.append(store.push(numbered(5), persistent=True))
        assert issued[-1] > max(issued[:-1]), f"id reused after a restart: {issued}"
        for popped in h.drain(store):
            store.ack(popped[0])
        issued.append(store.push(numbered(6), persistent=True))
        store.purge()
        del store
        h.restart()  # the queue is empty now
        store = h.queue()
        assert_counts(store, 0, 0, "after acking and purging everything")
        issued.append(store.push(numbered(7), persistent=True))
        assert issued[-1] > max(issued[:-1]), f"id reused after a restart: {issued}"


@_case("durable")
def check_purge_survives_restart(factory: BackendFactory, data_dir: Path) -> None:
    """A purge (without a flush after it) holds after a clean restart; the unacked messages
    it kept are back, flagged redelivered."""
    with BackendHarness(factory, data_dir) as h:
        store, pushed = _push_flush_pop(h, 5, 1)
        assert store.purge() == 4
        del store
        h.restart(flush=False)
        _assert_recovered(h, h.queue(), [(pushed[0][0], pushed[0][1], True)])


@_case("durable")
def check_delete_queue_survives_restart(factory: BackendFactory, data_dir: Path) -> None:
    """A deleted queue stays empty after a restart; its neighbours keep their messages."""
    with BackendHarness(factory, data_dir) as h:
        doomed = h.queue("doomed")
        for n in range(3):
            doomed.push(numbered(n), persistent=True)
        kept = h.queue("kept")
        expected = [(kept.push(numbered(n), persistent=True), numbered(n), False) for n in range(3)]
        h.flush()
        del doomed, kept
        h.backend.delete_queue("/", "doomed")
        h.restart(flush=False)
        doomed = h.queue("doomed")
        assert_counts(doomed, 0, 0, "for a deleted queue after a restart")
        assert h.pop(doomed) is None
        _assert_recovered(h, h.queue("kept"), expected)


def _assert_recovered_subset(
    h: BackendHarness,
    store: QueueStore,
    required: Sequence[Popped],
    optional: Sequence[Popped],
) -> None:
    """After a crash: every ``required`` message is back, possibly some ``optional`` ones,
    nothing else; ready (``ready_count`` and ``ready_bytes`` are theirs), in id order, with
    their bytes, each shown by ``peek`` before ``pop`` takes it. Those expected flagged
    redelivered are; of those expected unflagged (never delivered, so all after the delivered
    ones), the first few may be flagged too (the contract's "bounded window" past the last
    delivered one)."""
    allowed = {entry[0]: entry for entry in [*required, *optional]}
    assert store.unacked_count == 0, "messages are unacked right after a restart"
    ready, ready_bytes = store.ready_count, store.ready_bytes
    got: list[Popped] = []
    while (peeked := h.peek(store)) is not None:
        assert_popped(h.pop(store), *peeked)
        got.append(peeked)
    assert h.pop(store) is None, "pop() returned a message where peek() showed none"
    assert ready == len(got), f"ready_count was {ready} after a crash but {len(got)} came back"
    came_back = body_bytes(message for _, message, _ in got)
    assert ready_bytes == came_back, (
        f"ready_bytes was {ready_bytes} after a crash but the bodies that came back make"
        f" {came_back}"
    )
    got_ids = [entry[0] for entry in got]
    assert got_ids == sorted(got_ids), f"recovered messages are not in id order: {got_ids}"
    in_window = True
    for message_id, message, redelivered in got:
        assert message_id in allowed, f"message {message_id} came back but should not have"
        _, expected_message, expected_flag = allowed[message_id]
        assert_message(message, expected_message, f"message {message_id}")
        if expected_flag:
            assert redelivered, f"message {message_id} was delivered but came back unflagged"
        elif redelivered:
            assert in_window, (
                f"message {message_id} was never delivered and came back flagged redelivered"
                " after an unflagged one (the window of flagged messages must be contiguous)"
            )
        else:
            in_window = False
    missing = {entry[0] for entry in required} - set(got_ids)
    assert not missing, f"flushed persistent messages lost in a crash: {sorted(missing)}"


@_case("durable")
def check_crash_keeps_flushed_persistent(factory: BackendFactory, data_dir: Path) -> None:
    """After a crash (no ``close``), persistent messages covered by a completed flush are back;
    persistent ones pushed after it may be; transient ones are not."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        flushed = [(store.push(numbered(n), persistent=True), numbered(n), False) for n in range(4)]
        h.flush()
        late = [(store.push(numbered(n), persistent=True), numbered(n), False) for n in range(4, 6)]
        store.push(numbered(6), persistent=False)
        del store
        h.crash()
        _assert_recovered_subset(h, h.queue(), flushed, late)


@_case("durable")
def check_crash_redelivers_popped(factory: BackendFactory, data_dir: Path) -> None:
    """After a crash, a message handed out by ``pop`` comes back flagged redelivered (``pop``
    may hold messages back until a flush to guarantee it), one acked after the last flush may come
    back (flagged), and never-popped ones come back unflagged but for a window right after the
    delivered ones."""
    with BackendHarness(factory, data_dir) as h:
        store, pushed = _push_flush_pop(h, 5, 3)
        store.ack(pushed[1][0])
        store.requeue(pushed[2][0])
        del store
        h.crash()
        required = [(pushed[n][0], pushed[n][1], n < 3) for n in (0, 2, 3, 4)]
        _assert_recovered_subset(h, h.queue(), required, [(pushed[1][0], pushed[1][1], True)])


@_case("durable")
def check_ready_bytes_after_crash(factory: BackendFactory, data_dir: Path) -> None:
    """After a crash that follows a clean restart, ``ready_count`` and ``ready_bytes`` are those
    of the messages that come back: the persistent ones (requeued and unacked ones included),
    maybe those pushed after the last flush, never transient ones (not even a megabyte of them,
    which a backend may well have written out before the crash)."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [make_message(b"%d" % n * (n + 1), timestamp_ms=T0_MS - n) for n in range(12)]
        ids = [store.push(m, persistent=n % 4 != 3) for n, m in enumerate(messages)]
        for _ in range(5):
            h.pop(store)
        store.requeue(ids[1])
        store.ack(ids[2])
        del store
        h.restart()
        store = h.queue()
        h.pop(store)  # ids[0], again
        h.flush()
        late = numbered(12)
        late_id = store.push(late, persistent=True)
        for n in range(8):
            store.push(make_message(b"%d" % n * (1 << 17)), persistent=False)
        del store
        h.crash()
        required = [(ids[n], messages[n], n < 5) for n in range(12) if n % 4 != 3 and n != 2]
        _assert_recovered_subset(h, h.queue(), required, [(late_id, late, False)])
