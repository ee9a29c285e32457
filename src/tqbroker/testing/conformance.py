"""A conformance suite for storage backends (``tqbroker.backends.base``).

Any backend, built-in or third party, can be checked against the contract in
``tqbroker.backends.base`` from a pytest module::

    from pathlib import Path

    from tqbroker.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        def make_backend(self, data_dir: Path) -> MyBackend:
            return MyBackend()

pytest then runs ``TestMyBackend::test_conformance[<case>]`` for every case in ``CASES``:
ordering, requeue, ack, purge, counts, ``peek``, ``ready_bytes``, byte-exact messages and their
``timestamp_ms`` (message TTLs count from it), priority queues built over the backend (one store
per level, as the broker builds ``x-max-priority`` queues), queue isolation, ``delete_queue``,
sharing the data directory, the flush protocol and, for a backend whose ``durable`` is true,
restarts (clean and simulated crashes: the messages, ``peek`` and ``ready_bytes`` after them);
and a Hypothesis state machine (case ``stateful``) that drives the backend side by side with the
in-memory reference backend. Cases that do not apply (durability cases on a non-durable backend,
"survives nothing" on a durable one) are skipped.

On the subclass:

- ``make_backend(data_dir)`` is the ``BackendFactory``: a callable ``(data_dir: Path) -> Backend``
  returning a fresh instance that is *not yet opened* (the suite calls ``open(data_dir)`` itself,
  and calls the factory again on the same directory to simulate a restart). Constructing an
  instance must not touch the disk: the suite builds one unopened instance per case to read
  ``durable``;
- ``known_failures = {case name: reason}`` marks those cases strict ``xfail``;
- to run one class against several backends, override the ``conformance_factory`` fixture
  instead (``@pytest.fixture(params=[...])`` returning a factory).

Without pytest: ``run_conformance(factory, directory)`` runs every applicable case; each
``check_*`` function takes ``(factory, data_dir)`` and can be called on its own; the state machine
alone is ``run_stateful(factory)`` or, as a ``unittest.TestCase``, ``stateful_test_case(factory)``.

The suite runs without Trio: backends are passive, and the flush work returned by ``begin_flush``
is a plain blocking callable, run inline by ``run_flush``. ``pop`` below pops as the broker does:
when a durable backend's ``pop`` returns ``None`` with messages ready (it must then report
``needs_flush``) it flushes and retries once, and after a pop it flushes if the store
``wants_flush``; ``peek`` below retries the same way.

Messages are compared by exchange, routing key, raw properties, body and ``timestamp_ms``. The
suite's messages always carry a non-zero timestamp, as the broker's do (it stamps every message it
accepts), so a backend may treat 0 as "not stamped".

Restarts: ``BackendHarness.restart`` closes the instance and opens a new one from the factory on
the same directory. ``BackendHarness.crash`` simulates a crash of the process (not a power loss):
it drops the instance without calling ``close`` and runs the garbage collector before opening a
new one, so a backend holding an exclusive lock must release it when collected; what reached the
page cache survives, and a backend whose finaliser closes cleanly still passes (a clean close
satisfies every crash assertion).

Needs pytest and Hypothesis (both in tqbroker's ``test`` extra).

Runtime: the state machine runs 50 examples of up to 30 steps; the environment variables
``TQBROKER_CONFORMANCE_EXAMPLES`` and ``TQBROKER_CONFORMANCE_STEPS`` raise that (nightly runs).
Failures are ``AssertionError``s carrying explicit messages, readable whether or not pytest
rewrites this module's asserts; do not run the suite under ``python -O``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import shutil
import tempfile
import threading
import unittest
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Literal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ..backends.base import Backend, QueueStore
from ..backends.memory import MemoryBackend, MemoryQueueStore
from ..broker.priority import PriorityStore, level_store_names
from ..model import Message
from ..protocol.methods import BasicProperties

__all__ = [
    "CASES",
    "T0_MS",
    "BackendConformance",
    "BackendFactory",
    "BackendHarness",
    "BackendStateMachine",
    "ConformanceCase",
    "make_message",
    "open_backend",
    "peek",
    "pop",
    "run_conformance",
    "run_flush",
    "run_stateful",
    "stateful_settings",
    "stateful_test_case",
]

BackendFactory = Callable[[Path], Backend]
"""Returns a fresh, unopened backend for ``data_dir`` (the suite calls ``open`` itself)."""

Popped = tuple[int, Message, bool]

# An id no backend hands out in a test: ids increase from wherever a store starts.
NEVER_ISSUED_ID = 2**62

# A wall-clock time in milliseconds (2023-11-14), around which the suite stamps its messages.
T0_MS = 1_700_000_000_000


# --- helpers ---------------------------------------------------------------------------------


def open_backend(factory: BackendFactory, data_dir: Path) -> Backend:
    """A new instance from ``factory``, opened on ``data_dir``."""
    backend = factory(data_dir)
    backend.open(data_dir)
    return backend


def run_flush(backend: Backend) -> bool:
    """Run one flush synchronously: ``begin_flush()`` then its blocking work, inline. Returns
    whether there was anything to flush."""
    work = backend.begin_flush()
    if work is None:
        return False
    work()
    return True


def _flushing_once(
    backend: Backend, store: QueueStore, call: Callable[[], Popped | None], name: str
) -> Popped | None:
    """``call()``, and when it returns ``None`` with messages ready (the contract allows it
    only while the backend ``needs_flush``), a flush and ``call()`` again."""
    got = call()
    if got is None and store.ready_count > 0:
        assert backend.needs_flush, (
            f"{name}() returned None with {store.ready_count} ready messages but needs_flush is"
            " false"
        )
        assert run_flush(backend), "needs_flush is true but begin_flush() returned None"
        got = call()
        assert got is not None, (
            f"{name}() still returned None after a flush with {store.ready_count} ready messages"
        )
    return got


def pop(backend: Backend, store: QueueStore) -> Popped | None:
    """``store.pop()`` as the broker does it: when a durable backend holds back a ready message
    until a flush (the contract lets ``pop`` do that only while ``needs_flush``), flush once and
    retry; after a pop, flush when the store ``wants_flush``."""
    popped = _flushing_once(backend, store, store.pop, "pop")
    if store.wants_flush:
        run_flush(backend)
    return popped


def peek(backend: Backend, store: QueueStore) -> Popped | None:
    """``store.peek()``, flushing once and retrying as ``pop`` does (``peek`` returns ``None``
    whenever ``pop`` would)."""
    return _flushing_once(backend, store, store.peek, "peek")


def make_message(
    body: bytes = b"",
    *,
    exchange: str = "conformance",
    routing_key: str = "rk",
    properties: BasicProperties | None = None,
    timestamp_ms: int = T0_MS,
) -> Message:
    """A message as the broker would hand it to a backend (stamped: ``timestamp_ms``)."""
    raw = (properties or BasicProperties()).encode()
    return Message(exchange, routing_key, raw, body, timestamp_ms=timestamp_ms)


def _numbered(n: int) -> Message:
    return make_message(b"message %d" % n, routing_key=f"rk.{n}", timestamp_ms=T0_MS + n)


def _describe(message: Message) -> str:
    body = bytes(message.body)
    shown = repr(body[:40]) + ("..." if len(body) > 40 else "")
    return (
        f"Message(exchange={message.exchange!r}, routing_key={message.routing_key!r}, "
        f"properties_raw={bytes(message.properties_raw)[:40]!r}, body={shown} ({len(body)} bytes),"
        f" timestamp_ms={message.timestamp_ms!r})"
    )


def _same_message(actual: Message, expected: Message) -> bool:
    return (
        actual.exchange == expected.exchange
        and actual.routing_key == expected.routing_key
        and bytes(actual.properties_raw) == bytes(expected.properties_raw)
        and bytes(actual.body) == bytes(expected.body)
        and actual.timestamp_ms == expected.timestamp_ms
    )


def _assert_message(actual: Message, expected: Message, what: str = "message") -> None:
    assert _same_message(actual, expected), (
        f"{what} differs:\n  got      {_describe(actual)}\n  expected {_describe(expected)}"
    )


def _assert_popped(
    popped: Popped | None,
    message_id: int,
    message: Message,
    redelivered: bool,
    call: str = "pop()",
) -> None:
    assert popped is not None, f"{call} returned None, expected id {message_id}"
    got_id, got_message, got_redelivered = popped
    assert got_id == message_id, f"{call} returned id {got_id}, expected {message_id}"
    _assert_message(got_message, message, f"message {message_id} from {call}")
    assert got_redelivered is redelivered, (
        f"message {message_id} from {call}: redelivered={got_redelivered!r}, expected"
        f" {redelivered!r}"
    )


def _snapshot(store: QueueStore) -> tuple[int, int, int]:
    return store.ready_count, store.unacked_count, store.ready_bytes


def _assert_peek_then_pop(
    h: BackendHarness, store: QueueStore, message_id: int, message: Message, redelivered: bool
) -> None:
    """``peek`` (twice) shows the expected next message and changes no count; ``pop`` then
    takes that message."""
    before = _snapshot(store)
    for _ in range(2):
        _assert_popped(h.peek(store), message_id, message, redelivered, "peek()")
        after = _snapshot(store)
        assert after == before, (
            f"(ready_count, unacked_count, ready_bytes) went from {before} to {after} on peek()"
        )
    _assert_popped(h.pop(store), message_id, message, redelivered)


def _assert_counts(store: QueueStore, ready: int, unacked: int, when: str = "") -> None:
    got = (store.ready_count, store.unacked_count)
    suffix = f" {when}" if when else ""
    assert got == (ready, unacked), (
        f"(ready_count, unacked_count) = {got}{suffix}, expected {(ready, unacked)}"
    )


def _assert_ready_bytes(store: QueueStore, expected: int, when: str) -> None:
    got = store.ready_bytes
    assert got == expected, f"ready_bytes = {got} {when}, expected {expected}"


def _body_bytes(messages: Iterable[Message]) -> int:
    return sum(len(message.body) for message in messages)


def _assert_flushed(backend: Backend) -> None:
    assert not backend.needs_flush, "needs_flush is true right after a completed flush"
    assert backend.begin_flush() is None, (
        "begin_flush() returned work right after a completed flush with no new writes"
    )


class BackendHarness:
    """One backend on one data directory across simulated restarts; a context manager that
    closes the current instance on exit."""

    def __init__(self, factory: BackendFactory, data_dir: Path) -> None:
        self.factory = factory
        self.data_dir = data_dir
        self._backend: Backend | None = open_backend(factory, data_dir)

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("the backend is closed")
        return self._backend

    @property
    def durable(self) -> bool:
        return self.backend.durable

    def queue(self, queue: str = "q", vhost: str = "/") -> QueueStore:
        return self.backend.open_queue(vhost, queue)

    def flush(self) -> bool:
        return run_flush(self.backend)

    def pop(self, store: QueueStore) -> Popped | None:
        return pop(self.backend, store)

    def peek(self, store: QueueStore) -> Popped | None:
        return peek(self.backend, store)

    def drain(self, store: QueueStore) -> list[Popped]:
        """Pop every ready message."""
        popped: list[Popped] = []
        while (item := self.pop(store)) is not None:
            popped.append(item)
        return popped

    def restart(self, *, flush: bool = True) -> None:
        """Clean restart: optionally flush, ``close``, then open a new instance on the same
        directory. Stores obtained before are stale; open them again."""
        if flush:
            self.flush()
        self.backend.close()
        self._backend = None
        self._backend = open_backend(self.factory, self.data_dir)

    def crash(self) -> None:
        """Simulated crash: drop the instance without ``close`` (the caller must hold no store
        of it), collect it, then open a new instance on the same directory."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # unclosed files: that's the point
            self._backend = None
            gc.collect()
        self._backend = open_backend(self.factory, self.data_dir)

    def close(self) -> None:
        if self._backend is not None:
            backend, self._backend = self._backend, None
            backend.close()

    def __enter__(self) -> BackendHarness:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # don't let a failing close hide the failure
            self.close()


# --- the cases -------------------------------------------------------------------------------

CaseFunction = Callable[[BackendFactory, Path], None]
AppliesTo = Literal["all", "durable", "non-durable"]


@dataclass(frozen=True)
class ConformanceCase:
    """One check: ``function(factory, data_dir)``; ``applies_to`` says for which backends."""

    name: str
    function: CaseFunction
    applies_to: AppliesTo

    def applies(self, durable: bool) -> bool:
        if self.applies_to == "all":
            return True
        return durable == (self.applies_to == "durable")


CASES: list[ConformanceCase] = []
"""Every case, in the order they run."""


def _case(applies_to: AppliesTo = "all") -> Callable[[CaseFunction], CaseFunction]:
    def register(function: CaseFunction) -> CaseFunction:
        name = function.__name__.removeprefix("check_")
        CASES.append(ConformanceCase(name, function, applies_to))
        return function

    return register


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
        _assert_counts(store, 0, 0, "for a new queue")
        assert h.pop(store) is None, "pop() on a new queue returned a message"
        h.flush()
        _assert_flushed(h.backend)


@_case()
def check_ids_increase(factory: BackendFactory, data_dir: Path) -> None:
    """``push`` returns strictly increasing ids, also after pops, acks, requeues and purges."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        ids = [store.push(_numbered(n), persistent=n % 2 == 0) for n in range(50)]
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
        more = [store.push(_numbered(n), persistent=True) for n in range(50, 60)]
        assert more == sorted(set(more)), f"push() ids are not strictly increasing: {more}"
        assert more[0] > ids[-1], (
            f"an id was reused: {more[0]} after {ids[-1]} (following pops, acks and a purge)"
        )


@_case()
def check_pop_order(factory: BackendFactory, data_dir: Path) -> None:
    """``pop`` hands out ready messages in id order, unflagged, each once; then ``None``."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [_numbered(n) for n in range(20)]
        ids = [store.push(m, persistent=n % 3 != 0) for n, m in enumerate(messages)]
        _assert_counts(store, 20, 0, "after 20 pushes")
        for n, (message_id, message) in enumerate(zip(ids, messages, strict=True)):
            _assert_popped(h.pop(store), message_id, message, False)
            _assert_counts(store, 19 - n, n + 1, f"after {n + 1} pops")
        assert h.pop(store) is None, "pop() returned a message from an exhausted queue"
        _assert_counts(store, 0, 20, "after popping everything")


@_case()
def check_requeue_order(factory: BackendFactory, data_dir: Path) -> None:
    """Requeued messages come back before newer ones, in id order whatever the requeue order,
    flagged redelivered; the flag sticks across further requeues."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [_numbered(n) for n in range(6)]
        ids = [store.push(m, persistent=True) for m in messages]
        for n in range(4):
            _assert_popped(h.pop(store), ids[n], messages[n], False)
        store.requeue(ids[2])
        store.requeue(ids[0])
        _assert_counts(store, 4, 2, "after requeueing 2 of 4 unacked")
        late = _numbered(6)
        late_id = store.push(late, persistent=True)
        _assert_popped(h.pop(store), ids[0], messages[0], True)
        store.requeue(ids[0])  # back again, still ahead of everything
        _assert_popped(h.pop(store), ids[0], messages[0], True)
        _assert_popped(h.pop(store), ids[2], messages[2], True)
        _assert_popped(h.pop(store), ids[4], messages[4], False)
        store.requeue(ids[3])  # older than the remaining ready ones
        _assert_popped(h.pop(store), ids[3], messages[3], True)
        _assert_popped(h.pop(store), ids[5], messages[5], False)
        _assert_popped(h.pop(store), late_id, late, False)
        assert h.pop(store) is None
        _assert_counts(store, 0, 7, "with everything delivered")


@_case()
def check_ack_removes(factory: BackendFactory, data_dir: Path) -> None:
    """``ack`` forgets an unacked message for good: it is neither counted nor handed out."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [_numbered(n) for n in range(4)]
        ids = [store.push(m, persistent=True) for m in messages]
        for message_id, message in zip(ids[:3], messages[:3], strict=True):
            _assert_popped(h.pop(store), message_id, message, False)
        store.ack(ids[1])
        _assert_counts(store, 1, 2, "after acking 1 of 3 unacked")
        store.requeue(ids[1])  # acked: unknown now
        _assert_counts(store, 1, 2, "after requeueing an acked id")
        store.ack(ids[0])
        store.ack(ids[2])
        _assert_counts(store, 1, 0, "after acking every unacked message")
        _assert_popped(h.pop(store), ids[3], messages[3], False)
        store.ack(ids[3])
        _assert_counts(store, 0, 0, "after acking everything")
        assert h.pop(store) is None, "an acked message came back"


@_case()
def check_unknown_ids_ignored(factory: BackendFactory, data_dir: Path) -> None:
    """``ack`` and ``requeue`` ignore ids never issued, ids already acked, and ids issued by
    another queue's store."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue("q1")
        other = h.queue("q2")
        message = _numbered(1)
        message_id = store.push(message, persistent=True)
        _assert_popped(h.pop(store), message_id, message, False)
        for bogus in (NEVER_ISSUED_ID, NEVER_ISSUED_ID + 1):
            store.ack(bogus)
            store.requeue(bogus)
            _assert_counts(store, 0, 1, f"after ack/requeue of never-issued id {bogus}")
        other.ack(message_id)  # an id of store, unknown to other
        other.requeue(message_id)
        _assert_counts(store, 0, 1, "after ack/requeue of its id on another queue")
        _assert_counts(other, 0, 0, "after ack/requeue of another queue's id")
        store.ack(message_id)
        store.ack(message_id)
        store.requeue(message_id)
        _assert_counts(store, 0, 0, "after a double ack and a requeue of an acked id")
        assert h.pop(store) is None, "an acked message came back"


@_case()
def check_non_unacked_ids_ignored(factory: BackendFactory, data_dir: Path) -> None:
    """``ack`` and ``requeue`` act only on unacked messages: on a ready id (never delivered, or
    already requeued) they change nothing."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        messages = [_numbered(n) for n in range(3)]
        ids = [store.push(m, persistent=True) for m in messages]
        store.ack(ids[2])  # ready, never delivered
        store.requeue(ids[2])
        _assert_counts(store, 3, 0, "after ack/requeue of a never-delivered id")
        _assert_popped(h.pop(store), ids[0], messages[0], False)
        store.requeue(ids[0])
        store.requeue(ids[0])  # already ready again
        _assert_counts(store, 3, 0, "after requeueing the same id twice")
        store.ack(ids[0])  # ready (requeued), not unacked
        _assert_counts(store, 3, 0, "after acking a requeued (ready) id")
        _assert_popped(h.pop(store), ids[0], messages[0], True)
        _assert_popped(h.pop(store), ids[1], messages[1], False)
        _assert_popped(h.pop(store), ids[2], messages[2], False)
        assert h.pop(store) is None, "a message was handed out twice"
        _assert_counts(store, 0, 3, "with everything delivered")


@_case()
def check_purge(factory: BackendFactory, data_dir: Path) -> None:
    """``purge`` drops every ready message (requeued ones included), keeps unacked ones and
    returns how many it dropped."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        assert store.purge() == 0, "purge() of an empty queue did not return 0"
        messages = [_numbered(n) for n in range(6)]
        ids = [store.push(m, persistent=n % 2 == 0) for n, m in enumerate(messages)]
        for n in range(3):
            _assert_popped(h.pop(store), ids[n], messages[n], False)
        store.requeue(ids[0])
        _assert_counts(store, 4, 2, "before the purge")
        dropped = store.purge()
        assert dropped == 4, f"purge() returned {dropped}, expected 4 (3 ready + 1 requeued)"
        _assert_counts(store, 0, 2, "after the purge")
        assert h.pop(store) is None, "a purged message came back"
        store.requeue(ids[0])  # purged: unknown now
        _assert_counts(store, 0, 2, "after requeueing a purged id")
        store.requeue(ids[2])  # unacked ones survive the purge
        _assert_counts(store, 1, 1, "after requeueing an unacked message kept by the purge")
        later = _numbered(9)
        later_id = store.push(later, persistent=True)
        _assert_popped(h.pop(store), ids[2], messages[2], True)
        _assert_popped(h.pop(store), later_id, later, False)
        store.ack(ids[1])
        store.ack(ids[2])
        store.ack(later_id)
        _assert_counts(store, 0, 0, "after acking everything")
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
                store.push(_numbered(step), persistent=rng.random() < 0.5)
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
            _assert_counts(store, ready, len(unacked), f"at step {step} ({op})")


@_case()
def check_peek(factory: BackendFactory, data_dir: Path) -> None:
    """``peek`` shows what ``pop`` returns next (id, message, redelivered) and changes nothing:
    not the counts, not ``ready_bytes``, not the order, however often it is called; requeued
    messages show first; ``None`` when nothing is ready, after a purge too."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        assert h.peek(store) is None, "peek() on a new queue returned a message"
        messages = [_numbered(n) for n in range(6)]
        ids = [store.push(m, persistent=n % 2 == 0) for n, m in enumerate(messages)]
        for n in range(3):
            _assert_peek_then_pop(h, store, ids[n], messages[n], False)
        store.requeue(ids[2])
        store.requeue(ids[0])
        _assert_peek_then_pop(h, store, ids[0], messages[0], True)
        late = _numbered(6)
        late_id = store.push(late, persistent=True)
        _assert_peek_then_pop(h, store, ids[2], messages[2], True)
        _assert_peek_then_pop(h, store, ids[3], messages[3], False)
        store.requeue(ids[1])  # older than everything ready
        _assert_peek_then_pop(h, store, ids[1], messages[1], True)
        for n in (4, 5):
            _assert_peek_then_pop(h, store, ids[n], messages[n], False)
        _assert_peek_then_pop(h, store, late_id, late, False)
        assert h.peek(store) is None, "peek() returned a message from an exhausted queue"
        _assert_counts(store, 0, 7, "with everything delivered")
        store.requeue(ids[3])
        store.push(_numbered(7), persistent=True)
        assert store.purge() == 2
        assert h.peek(store) is None, "peek() returned a message after a purge"
        _assert_counts(store, 0, 6, "after the purge")


@_case()
def check_ready_bytes(factory: BackendFactory, data_dir: Path) -> None:
    """``ready_bytes`` is the sum of the body lengths of the ready messages: pushes and requeues
    add to it, pops and purges take from it; acks (of unacked messages) and ack/requeue of
    unknown ids leave it alone; empty bodies count for nothing."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        _assert_ready_bytes(store, 0, "for a new queue")
        bodies = [b"", b"x", b"0123456789", b"\x00" * 1000, b"b" * 65536, b"y" * 7]
        ids = [store.push(make_message(b), persistent=n % 2 == 1) for n, b in enumerate(bodies)]
        sizes = dict(zip(ids, map(len, bodies), strict=True))
        total = sum(sizes.values())
        _assert_ready_bytes(store, total, "after the pushes")
        popped = [h.pop(store) for _ in range(5)]
        delivered = [item[0] for item in popped if item is not None]
        assert len(delivered) == 5
        _assert_ready_bytes(store, sizes[ids[5]], "after popping all but the last")
        store.requeue(delivered[4])
        store.requeue(delivered[1])
        _assert_ready_bytes(store, sizes[ids[5]] + sizes[ids[4]] + 1, "after two requeues")
        store.ack(delivered[3])
        store.ack(delivered[3])
        for unknown in (NEVER_ISSUED_ID, delivered[1]):  # never issued; ready, not unacked
            store.ack(unknown)
            store.requeue(unknown)
        _assert_ready_bytes(store, sizes[ids[5]] + sizes[ids[4]] + 1, "after acks")
        assert store.purge() == 3
        _assert_ready_bytes(store, 0, "after a purge")
        store.requeue(delivered[2])  # unacked: kept by the purge
        _assert_ready_bytes(store, 10, "after requeueing a message the purge kept")
        _assert_popped(h.pop(store), delivered[2], make_message(bodies[2]), True)
        _assert_ready_bytes(store, 0, "after popping it again")
        store.ack(delivered[2])
        store.ack(delivered[0])
        _assert_counts(store, 0, 0, "after acking everything")
        _assert_ready_bytes(store, 0, "after acking everything")


_ALL_PROPERTIES = BasicProperties(
    content_type="application/json",
    content_encoding="gzip",
    headers={
        "str": "välue",
        "int": -7,
        "big": 2**40,
        "bool": True,
        "float": 1.5,
        "bytes": b"\x00\xff",
        "none": None,
        "nested": {"list": [1, "two", None], "deep": {"x": 3}},
    },
    delivery_mode=2,
    priority=9,
    correlation_id="corr-1",
    reply_to="amq.rabbitmq.reply-to",
    expiration="60000",
    message_id="id-\u2603",
    timestamp=1_700_000_000,
    type="kind",
    user_id="guest",
    app_id="conformance",
    cluster_id="",
)


def _exact_messages() -> list[Message]:
    return [
        make_message(b""),
        make_message(b"", exchange="", routing_key=""),
        make_message(bytes(range(256)), properties=_ALL_PROPERTIES),
        make_message(b"\x00" * 17, exchange="\u00e9" * 127, routing_key="r" * 255),
        make_message(
            "caf\u00e9 \U0001f407\r\n\x00".encode(),
            exchange="\u043e\u0431\u043c\u0435\u043d",
            routing_key="\u043a\u043b\u044e\u0447.\U0001f407.#",
            properties=BasicProperties(headers={}),
        ),
        # Looks like a frame.
        Message("ex", "rk", b"\x00\x00", b"\xce\x01\x00\x00", timestamp_ms=T0_MS),
    ]


def _check_round_trip(factory: BackendFactory, data_dir: Path, messages: Sequence[Message]) -> None:
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        ids = [store.push(m, persistent=True) for m in messages]
        for message_id, message in zip(ids, messages, strict=True):
            _assert_popped(h.pop(store), message_id, message, False)
        for message_id in ids:
            store.requeue(message_id)
        for message_id, message in zip(ids, messages, strict=True):
            _assert_peek_then_pop(h, store, message_id, message, True)
        if not h.durable:
            return
        # And byte-exact from disk: unacked ones after a restart, then never-popped ones.
        for message_id in ids:
            store.requeue(message_id)
        fresh = [store.push(m, persistent=True) for m in messages]
        del store
        h.restart()
        store = h.queue()
        for message_id, message in zip(ids, messages, strict=True):
            _assert_popped(h.pop(store), message_id, message, True)
        for message_id, message in zip(fresh, messages, strict=True):
            _assert_popped(h.pop(store), message_id, message, False)


def _priority_store(h: BackendHarness, levels: int = 3) -> PriorityStore:
    """A priority queue over this backend, built as the broker builds ``x-max-priority``
    queues: one store per level."""
    return PriorityStore([h.queue(name) for name in level_store_names("prio", levels - 1)])


def _prioritised(n: int, priority: int | None) -> Message:
    return make_message(
        b"message %d" % n, properties=BasicProperties(priority=priority), timestamp_ms=T0_MS + n
    )


@_case()
def check_priority_levels(factory: BackendFactory, data_dir: Path) -> None:
    """The broker's priority queues (one store of this backend per level): highest level
    first, FIFO within a level, priorities above the top level capped, a requeued message back
    at the front of its own level; counts and bytes summed over levels."""
    with BackendHarness(factory, data_dir) as h:
        store = _priority_store(h)
        plan = [(0, None), (1, 1), (2, 2), (3, 9), (4, 1), (5, 0)]
        ids = {n: store.push(_prioritised(n, p), persistent=True) for n, p in plan}
        _assert_counts(store, 6, 0, "after six pushes over three levels")
        order = [n for n, _ in sorted(plan, key=lambda item: -min(item[1] or 0, 2))]
        assert order == [2, 3, 1, 4, 0, 5]
        first = h.peek(store)
        _assert_popped(first, ids[2], _prioritised(2, 2), False, "peek()")
        _assert_popped(h.pop(store), ids[2], _prioritised(2, 2), False)
        _assert_popped(h.pop(store), ids[3], _prioritised(3, 9), False)
        store.requeue(ids[2])
        _assert_popped(h.pop(store), ids[2], _prioritised(2, 2), True)
        store.ack(ids[2])
        store.ack(ids[3])
        for n in order[2:]:
            _assert_popped(h.pop(store), ids[n], _prioritised(n, plan[n][1]), False)
        assert h.pop(store) is None
        _assert_counts(store, 0, 4, "with every level delivered")
        _assert_ready_bytes(store, 0, "with every level delivered")


@_case("durable")
def check_priority_levels_after_restart(factory: BackendFactory, data_dir: Path) -> None:
    """Persistent messages of a priority queue come back in priority order after a restart,
    those delivered before flagged redelivered."""
    with BackendHarness(factory, data_dir) as h:
        store = _priority_store(h)
        plan = [(0, 0), (1, 2), (2, 1), (3, 2)]
        ids = {n: store.push(_prioritised(n, p), persistent=True) for n, p in plan}
        _assert_popped(h.pop(store), ids[1], _prioritised(1, 2), False)
        h.restart()
        store = _priority_store(h)
        _assert_counts(store, 4, 0, "after the restart")
        for n, redelivered in ((1, True), (3, False), (2, False), (0, False)):
            _assert_popped(h.pop(store), ids[n], _prioritised(n, plan[n][1]), redelivered)


@_case()
def check_messages_byte_exact(factory: BackendFactory, data_dir: Path) -> None:
    """Exchange, routing key, raw properties and body come back exactly as pushed: empty and
    non-ASCII names, 255-byte names, every property, every byte value (after a restart too, for
    a durable backend)."""
    _check_round_trip(factory, data_dir, _exact_messages())


@_case()
def check_timestamps_round_trip(factory: BackendFactory, data_dir: Path) -> None:
    """``timestamp_ms`` comes back as pushed from ``pop`` and ``peek``, after a requeue and (for
    a durable backend, which stores it) after a restart, whatever the order of the timestamps:
    a transaction's messages, stamped when published, are pushed after newer ones at commit."""
    stamps = [T0_MS, T0_MS + 1, T0_MS - 86_400_000, 1, T0_MS + 1, 2**53, T0_MS + 999]
    messages = [make_message(b"stamped %d" % n, timestamp_ms=t) for n, t in enumerate(stamps)]
    _check_round_trip(factory, data_dir, messages)


@_case()
def check_large_and_empty_bodies(factory: BackendFactory, data_dir: Path) -> None:
    """A 1 MiB body (incompressible) and an empty one round-trip exactly, mixed with small ones
    (after a restart too, for a durable backend)."""
    big = random.Random(1).randbytes(1 << 20)
    messages = [
        make_message(big),
        make_message(b""),
        make_message(b"x"),
        make_message(big[::-1]),
        make_message(b"\x00" * (1 << 20)),
    ]
    _check_round_trip(factory, data_dir, messages)


_QUEUE_NAMES = [
    ("/", "a"),
    ("/", "b"),
    ("other", "a"),
    ("/", "A"),  # case-insensitive file systems
    ("", ""),
    ("/", "a/b"),
    ("/", "../escape"),
    ("/", "."),
    ("v\u00e9", "\u540d\u524d \U0001f407"),
    ("/", "q" * 255),
    ("\\", "nul\x00byte"),
]


@_case()
def check_queues_isolated(factory: BackendFactory, data_dir: Path) -> None:
    """Stores of different queues (same name in other vhosts included, and names that are
    awkward as file names) share nothing: messages, counts, acks by id, requeues and purges stay
    in their queue (across a restart too, for a durable backend)."""
    with BackendHarness(factory, data_dir) as h:
        stores = [h.queue(queue, vhost) for vhost, queue in _QUEUE_NAMES]
        sent: list[list[tuple[int, Message]]] = []
        for n, store in enumerate(stores):
            messages = [make_message(b"q%d m%d" % (n, k), routing_key=f"{n}") for k in range(n + 2)]
            sent.append([(store.push(m, persistent=True), m) for m in messages])
        for n, store in enumerate(stores):
            _assert_counts(store, n + 2, 0, f"for queue {_QUEUE_NAMES[n]}")
        first, second = stores[0], stores[1]
        _assert_popped(h.pop(first), *sent[0][0], False)
        _assert_popped(h.pop(second), *sent[1][0], False)
        first.ack(sent[0][0][0])  # ids may coincide between stores: only first's goes
        _assert_counts(second, 2, 1, "after an ack of the same id on another queue")
        second.requeue(sent[1][0][0])
        _assert_counts(first, 1, 0, "after a requeue on another queue")
        assert second.purge() == 3
        _assert_counts(first, 1, 0, "after a purge of another queue")
        del sent[0][0], sent[1][:]
        if h.durable:
            del store, stores, first, second
            h.restart()
            stores = [h.queue(queue, vhost) for vhost, queue in _QUEUE_NAMES]
        for n, store in enumerate(stores):
            _assert_counts(store, len(sent[n]), 0, f"for queue {_QUEUE_NAMES[n]}")
            for message_id, message in sent[n]:
                _assert_popped(h.pop(store), message_id, message, False)
            assert h.pop(store) is None, f"queue {_QUEUE_NAMES[n]} holds extra messages"


@_case()
def check_leaves_foreign_files_alone(factory: BackendFactory, data_dir: Path) -> None:
    """Every backend is opened on the broker's one data directory: a backend must tolerate
    files and directories it did not create there and leave them alone (across a restart)."""
    data_dir.mkdir(parents=True)
    foreign_file = data_dir / "someone-else.dat"
    foreign_file.write_bytes(b"not yours")
    foreign_dir = data_dir / "other-backend"
    foreign_dir.mkdir()
    (foreign_dir / "segment-0001").write_bytes(b"\x00" * 10)
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        message = _numbered(1)
        message_id = store.push(message, persistent=True)
        del store
        h.restart()
        store = h.queue()
        if h.durable:
            _assert_popped(h.pop(store), message_id, message, False)
    assert foreign_file.read_bytes() == b"not yours", "a foreign file in data_dir was changed"
    assert sorted(p.name for p in foreign_dir.iterdir()) == ["segment-0001"], (
        "a foreign directory in data_dir was changed"
    )
    assert (foreign_dir / "segment-0001").read_bytes() == b"\x00" * 10


@_case()
def check_delete_queue(factory: BackendFactory, data_dir: Path) -> None:
    """``delete_queue`` removes ready and unacked messages; the same name opens empty again;
    other queues (same name in another vhost included) keep theirs. Deleting a queue never
    opened is a no-op (the broker does it when declaring a transient queue)."""
    with BackendHarness(factory, data_dir) as h:
        h.backend.delete_queue("/", "never-opened")
        h.backend.delete_queue("/", "doomed")
        doomed = h.queue("doomed")
        kept = h.queue("doomed", "other-vhost")
        ids = [doomed.push(_numbered(n), persistent=True) for n in range(5)]
        kept_message = _numbered(99)
        kept_id = kept.push(kept_message, persistent=True)
        h.pop(doomed)
        h.pop(doomed)
        h.flush()
        h.backend.delete_queue("/", "doomed")
        del doomed
        again = h.queue("doomed")
        _assert_counts(again, 0, 0, "for a queue re-opened after delete_queue")
        assert h.pop(again) is None, "a re-opened queue handed out a deleted message"
        for message_id in ids:  # unknown in the new queue
            again.ack(message_id)
            again.requeue(message_id)
        _assert_counts(again, 0, 0, "after ack/requeue of the deleted queue's ids")
        new = _numbered(100)
        new_id = again.push(new, persistent=True)
        _assert_popped(h.pop(again), new_id, new, False)
        _assert_counts(kept, 1, 0, "for a queue of the same name in another vhost")
        _assert_popped(h.pop(kept), kept_id, kept_message, False)


@_case()
def check_flush_protocol(factory: BackendFactory, data_dir: Path) -> None:
    """``begin_flush`` returns ``None`` when nothing is pending; a durable backend needs a
    flush after a persistent push and no longer once the flush work has run; the backend stays
    healthy. A non-durable backend never needs a flush."""
    with BackendHarness(factory, data_dir) as h:
        backend = h.backend
        h.flush()
        _assert_flushed(backend)
        store = h.queue()
        for n in range(3):
            store.push(_numbered(n), persistent=True)
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
            _assert_flushed(backend)
        popped = h.pop(store)
        assert popped is not None
        store.ack(popped[0])
        store.purge()
        h.flush()
        _assert_flushed(backend)
        assert backend.healthy


@_case("durable")
def check_flush_covers_only_what_it_began_with(factory: BackendFactory, data_dir: Path) -> None:
    """A flush covers what was written before ``begin_flush``: a push between ``begin_flush``
    and the end of its work still needs a later flush."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        store.push(_numbered(1), persistent=True)
        work = h.backend.begin_flush()
        assert work is not None, "begin_flush() returned None after a persistent push"
        store.push(_numbered(2), persistent=True)  # the Trio thread goes on meanwhile
        work()
        assert h.backend.needs_flush, "a push made during a flush no longer needs a flush"
        assert h.flush(), "begin_flush() returned None for a push made during the last flush"
        _assert_flushed(h.backend)


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
            live[store.push(_numbered(n), persistent=True)] = _numbered(n)
        for _ in range(20):
            work = h.backend.begin_flush()
            join = _start_worker(work or (lambda: None))
            for n in range(10):
                message = _numbered(1000 + n)
                live[store.push(message, persistent=True)] = message
                popped = store.pop()  # no flushing from this thread while the work runs
                if popped is not None:
                    if n % 3:
                        store.ack(popped[0])
                        del live[popped[0]]
                    else:
                        store.requeue(popped[0])
            join()
            assert h.backend.healthy
        _assert_counts(store, len(live), 0, "after the concurrent flushes")
        del store
        h.restart()
        store = h.queue()
        _assert_counts(store, len(live), 0, "after a restart")
        for message_id, message, _redelivered in h.drain(store):
            _assert_message(message, live.pop(message_id), f"message {message_id}")
        assert not live, f"messages lost: {sorted(live)}"


@_case("non-durable")
def check_restart_keeps_nothing(factory: BackendFactory, data_dir: Path) -> None:
    """A non-durable backend survives nothing: after a restart every queue is empty, whatever
    ``persistent`` said."""
    with BackendHarness(factory, data_dir) as h:
        for queue in ("a", "b"):
            store = h.queue(queue)
            for n in range(4):
                store.push(_numbered(n), persistent=n % 2 == 0)
            h.pop(store)
        del store
        h.restart()
        for queue in ("a", "b"):
            store = h.queue(queue)
            _assert_counts(store, 0, 0, f"for queue {queue!r} after a restart")
            assert h.pop(store) is None


def _assert_recovered(h: BackendHarness, store: QueueStore, expected: Sequence[Popped]) -> None:
    """After a restart: exactly ``expected`` are ready (their bodies make ``ready_bytes``),
    nothing is unacked, and they peek and pop in order with their ids, bytes and flags."""
    _assert_counts(store, len(expected), 0, "after a restart")
    _assert_ready_bytes(store, _body_bytes(m for _, m, _ in expected), "after a restart")
    for message_id, message, redelivered in expected:
        _assert_peek_then_pop(h, store, message_id, message, redelivered)
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
        messages = [_numbered(n) for n in range(5)]
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
        pushed = [(store.push(_numbered(n), persistent=n % 2 == 0), _numbered(n)) for n in range(8)]
        for _ in range(3):
            h.pop(store)
        del store
        h.restart()
        expected = [(i, m, n < 3) for n, (i, m) in enumerate(pushed) if n % 2 == 0]
        _assert_recovered(h, h.queue(), expected)


@_case("durable")
def check_acked_gone_after_clean_restart(factory: BackendFactory, data_dir: Path) -> None:
    """Messages acked before a clean close (with or without a flush after the ack) do not come
    back; unacked ones do, flagged redelivered."""
    for flush_first in (True, False):
        with BackendHarness(factory, data_dir / f"flush-{flush_first}") as h:
            store = h.queue()
            pushed = [(store.push(_numbered(n), persistent=True), _numbered(n)) for n in range(6)]
            h.flush()
            for _ in range(4):
                h.pop(store)
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
        pushed = [(store.push(_numbered(n), persistent=True), _numbered(n)) for n in range(6)]
        for _ in range(4):
            h.pop(store)
        store.requeue(pushed[1][0])  # ready again, flagged
        store.requeue(pushed[3][0])
        h.pop(store)  # pushed[1] again: unacked
        del store
        h.restart()
        expected = [(i, m, n < 4) for n, (i, m) in enumerate(pushed)]
        store = h.queue()
        _assert_counts(store, 6, 0, "after a restart")
        _assert_popped(h.pop(store), *expected[0])
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
        _assert_counts(store, len(expected), 0, "after a restart")
        _assert_ready_bytes(store, _body_bytes(m for _, m, _ in expected), "after a restart")
        _assert_peek_then_pop(h, store, *expected[0])  # unacked across the next restart
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
        issued = [store.push(_numbered(n), persistent=True) for n in range(3)]
        issued += [store.push(_numbered(n), persistent=False) for n in range(3, 5)]
        del store
        h.restart()
        store = h.queue()
        issued.append(store.push(_numbered(5), persistent=True))
        assert issued[-1] > max(issued[:-1]), f"id reused after a restart: {issued}"
        for popped in h.drain(store):
            store.ack(popped[0])
        issued.append(store.push(_numbered(6), persistent=True))
        store.purge()
        del store
        h.restart()  # the queue is empty now
        store = h.queue()
        _assert_counts(store, 0, 0, "after acking and purging everything")
        issued.append(store.push(_numbered(7), persistent=True))
        assert issued[-1] > max(issued[:-1]), f"id reused after a restart: {issued}"


@_case("durable")
def check_purge_survives_restart(factory: BackendFactory, data_dir: Path) -> None:
    """A purge (without a flush after it) holds after a clean restart; the unacked messages
    it kept are back, flagged redelivered."""
    with BackendHarness(factory, data_dir) as h:
        store = h.queue()
        pushed = [(store.push(_numbered(n), persistent=True), _numbered(n)) for n in range(5)]
        h.flush()
        h.pop(store)
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
            doomed.push(_numbered(n), persistent=True)
        kept = h.queue("kept")
        expected = [
            (kept.push(_numbered(n), persistent=True), _numbered(n), False) for n in range(3)
        ]
        h.flush()
        del doomed, kept
        h.backend.delete_queue("/", "doomed")
        h.restart(flush=False)
        doomed = h.queue("doomed")
        _assert_counts(doomed, 0, 0, "for a deleted queue after a restart")
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
        _assert_popped(h.pop(store), *peeked)
        got.append(peeked)
    assert h.pop(store) is None, "pop() returned a message where peek() showed none"
    assert ready == len(got), f"ready_count was {ready} after a crash but {len(got)} came back"
    came_back = _body_bytes(message for _, message, _ in got)
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
        _assert_message(message, expected_message, f"message {message_id}")
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
        flushed = [
            (store.push(_numbered(n), persistent=True), _numbered(n), False) for n in range(4)
        ]
        h.flush()
        late = [
            (store.push(_numbered(n), persistent=True), _numbered(n), False) for n in range(4, 6)
        ]
        store.push(_numbered(6), persistent=False)
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
        store = h.queue()
        pushed = [(store.push(_numbered(n), persistent=True), _numbered(n)) for n in range(5)]
        h.flush()
        for _ in range(3):
            h.pop(store)
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
        late = _numbered(12)
        late_id = store.push(late, persistent=True)
        for n in range(8):
            store.push(make_message(b"%d" % n * (1 << 17)), persistent=False)
        del store
        h.crash()
        required = [(ids[n], messages[n], n < 5) for n in range(12) if n % 4 != 3 and n != 2]
        _assert_recovered_subset(h, h.queue(), required, [(late_id, late, False)])


# --- the state machine -----------------------------------------------------------------------


def stateful_settings(
    max_examples: int | None = None, stateful_step_count: int | None = None
) -> settings:
    """Settings for the state machine: 50 examples of up to 30 steps unless given here or by
    the ``TQBROKER_CONFORMANCE_EXAMPLES`` / ``TQBROKER_CONFORMANCE_STEPS`` variables."""
    if max_examples is None:
        max_examples = int(os.environ.get("TQBROKER_CONFORMANCE_EXAMPLES", "50"))
    if stateful_step_count is None:
        stateful_step_count = int(os.environ.get("TQBROKER_CONFORMANCE_STEPS", "30"))
    return settings(
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


_STATEFUL_QUEUES = ("q0", "q1")
_queue_names = st.sampled_from(("q0", "q0", "q0", "q1"))  # mostly one queue: deeper
_PROPERTY_CHOICES = [
    BasicProperties().encode(),
    BasicProperties(content_type="text/plain", delivery_mode=2).encode(),
    BasicProperties(headers={"k": 1, "n": {"x": b"y"}}, message_id="m").encode(),
]
_messages = st.builds(
    Message,
    exchange=st.sampled_from(["", "amq.direct", "ex"]),
    routing_key=st.text(max_size=8),
    properties_raw=st.sampled_from(_PROPERTY_CHOICES),
    body=st.binary(max_size=64),
    # Any order, none zero (unstamped) nor in the future (as a broker's clock stamps them).
    timestamp_ms=st.integers(min_value=1, max_value=T0_MS + 2**32),
)


@dataclass
class _Tracked:
    """A live message as both sides see it."""

    message: Message
    persistent: bool
    model_id: int
    unacked: bool = False
    delivered: bool = False  # handed out at least once, in this run or an earlier one


@dataclass
class _QueuePair:
    """One queue in the backend under test and in the model; ids are the tested backend's."""

    sut: QueueStore
    model: MemoryQueueStore
    tracked: dict[int, _Tracked] = field(default_factory=dict)
    by_model_id: dict[int, int] = field(default_factory=dict)
    dead_ids: list[int] = field(default_factory=list)  # acked, purged or dropped at a restart
    max_id: int | None = None


class BackendStateMachine(RuleBasedStateMachine):
    """Drives a backend and the in-memory reference backend (the model) with the same operations
    on two queues and compares them. Ids differ between the two, so each tested id is mapped to
    the model's; ``pop`` and ``peek`` must return the model's message (same id mapping, same
    bytes and ``timestamp_ms``) with ``redelivered`` true exactly when it was handed out before
    (in any run), and ``peek`` must change no count; the counts and ``ready_bytes`` must match
    the model's after every step.

    ``restart`` (flush or not, then close and re-open) updates the model per the contract: for a
    durable backend, surviving persistent messages become ready in id order, keep their ids and
    keep their delivered history; transient ones are gone; for a non-durable one, everything is.

    Subclass with ``factory`` set (``stateful_test_case`` and ``run_stateful`` do)."""

    factory: ClassVar[BackendFactory]
    base_dir: ClassVar[Path | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.data_dir = Path(tempfile.mkdtemp(prefix="tqbroker-conformance-", dir=self.base_dir))
        self.sut: Backend | None = open_backend(type(self).factory, self.data_dir)
        self.durable = self.sut.durable
        self.model = MemoryBackend()
        self.queues: dict[str, _QueuePair] = {}
        self._open_queues()

    def _open_queues(self) -> None:
        self.queues = {
            name: _QueuePair(self.backend.open_queue("/", name), self.model.open_queue("/", name))
            for name in _STATEFUL_QUEUES
        }

    @property
    def backend(self) -> Backend:
        assert self.sut is not None
        return self.sut

    def teardown(self) -> None:
        try:
            if self.sut is not None:
                self.sut.close()
        finally:
            self.sut = None
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _unacked(self) -> list[tuple[str, int]]:
        return sorted(
            (name, message_id)
            for name, pair in self.queues.items()
            for message_id, entry in pair.tracked.items()
            if entry.unacked
        )

    def _has_unacked(self) -> bool:
        return bool(self._unacked())

    @rule(queue=_queue_names, message=_messages, persistent=st.booleans())
    def push(self, queue: str, message: Message, persistent: bool) -> None:
        pair = self.queues[queue]
        message_id = pair.sut.push(message, persistent)
        assert pair.max_id is None or message_id > pair.max_id, (
            f"push() returned id {message_id}, not above the earlier {pair.max_id}"
        )
        pair.max_id = message_id
        model_id = pair.model.push(message, persistent)
        pair.tracked[message_id] = _Tracked(message, persistent, model_id)
        pair.by_model_id[model_id] = message_id
        if persistent and self.durable:
            assert self.backend.needs_flush, "needs_flush is false after a persistent push"

    @rule(
        queue=_queue_names,
        batch=st.lists(st.tuples(_messages, st.booleans()), min_size=2, max_size=6),
    )
    def push_batch(self, queue: str, batch: list[tuple[Message, bool]]) -> None:
        """Several pushes in one step, so queues grow deeper than purges keep them."""
        for message, persistent in batch:
            self.push(queue, message, persistent)

    @rule(queue=_queue_names)
    def pop(self, queue: str) -> None:
        pair = self.queues[queue]
        got = pop(self.backend, pair.sut)
        entry = self._expect(pair, got, pair.model.pop(), "pop()")
        if entry is not None:
            entry.unacked = entry.delivered = True

    @rule(queue=_queue_names)
    def peek(self, queue: str) -> None:
        pair = self.queues[queue]
        before = _snapshot(pair.sut)
        self._expect(pair, peek(self.backend, pair.sut), pair.model.peek(), "peek()")
        after = _snapshot(pair.sut)
        assert after == before, (
            f"(ready_count, unacked_count, ready_bytes) went from {before} to {after} on peek()"
        )

    def _expect(
        self, pair: _QueuePair, got: Popped | None, expected: Popped | None, call: str
    ) -> _Tracked | None:
        """Check what the backend's ``call`` returned against what the model's did; return
        the message's entry (None if the queue was empty)."""
        if expected is None:
            assert got is None, f"{call} returned {got!r} from a queue the model says is empty"
            return None
        assert got is not None, f"{call} returned None but the model has a ready message"
        model_id, _, model_redelivered = expected
        message_id, message, redelivered = got
        want_id = pair.by_model_id[model_id]
        assert message_id == want_id, f"{call} returned id {message_id}, expected {want_id}"
        entry = pair.tracked[message_id]
        assert not entry.unacked
        _assert_message(message, entry.message, f"message {message_id} from {call}")
        assert not model_redelivered or entry.delivered  # the model agrees with the bookkeeping
        assert redelivered is entry.delivered, (
            f"message {message_id} from {call}: redelivered={redelivered!r}, expected"
            f" {entry.delivered!r}"
        )
        return entry

    @rule(queue=_queue_names, count=st.integers(2, 5))
    def pop_several(self, queue: str, count: int) -> None:
        for _ in range(count):
            self.pop(queue)

    @precondition(_has_unacked)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        queue, message_id = data.draw(st.sampled_from(self._unacked()), label="ack")
        pair = self.queues[queue]
        entry = pair.tracked.pop(message_id)
        pair.sut.ack(message_id)
        pair.model.ack(entry.model_id)
        pair.dead_ids.append(message_id)

    @precondition(_has_unacked)
    @rule(data=st.data(), then_peek=st.booleans())
    def requeue(self, data: st.DataObject, then_peek: bool) -> None:
        """``then_peek``: peek at once (the requeued message, or an older one, is the head)."""
        queue, message_id = data.draw(st.sampled_from(self._unacked()), label="requeue")
        pair = self.queues[queue]
        entry = pair.tracked[message_id]
        pair.sut.requeue(message_id)
        pair.model.requeue(entry.model_id)
        entry.unacked = False
        if then_peek:
            self.peek(queue)

    @rule(queue=_queue_names, data=st.data(), do_ack=st.booleans())
    def ack_or_requeue_dead_id(self, queue: str, data: st.DataObject, do_ack: bool) -> None:
        """Unknown ids (acked, purged, dropped at a restart, never issued) are ignored."""
        pair = self.queues[queue]
        message_id = data.draw(st.sampled_from([NEVER_ISSUED_ID, *pair.dead_ids]), label="id")
        if do_ack:
            pair.sut.ack(message_id)
        else:
            pair.sut.requeue(message_id)

    @rule(queue=_queue_names)
    def purge(self, queue: str) -> None:
        pair = self.queues[queue]
        dropped = pair.sut.purge()
        expected = pair.model.purge()
        assert dropped == expected, f"purge() returned {dropped}, expected {expected}"
        for message_id, entry in list(pair.tracked.items()):
            if not entry.unacked:
                del pair.tracked[message_id]
                pair.dead_ids.append(message_id)

    @rule()
    def flush(self) -> None:
        run_flush(self.backend)
        _assert_flushed(self.backend)

    @rule(flush_first=st.booleans(), then_drain=st.booleans())
    def restart(self, flush_first: bool, then_drain: bool) -> None:
        """Clean restart; ``then_drain`` pops everything at once to check all that came back."""
        if flush_first:
            run_flush(self.backend)
        self.backend.close()
        self.sut = None
        self.sut = open_backend(type(self).factory, self.data_dir)
        old = self.queues
        self.model = MemoryBackend()
        self._open_queues()
        for name, pair in self.queues.items():
            previous = old[name]
            if not self.durable:
                continue  # ids may start over: forget the old ones altogether
            pair.max_id = previous.max_id
            pair.dead_ids = previous.dead_ids
            for message_id in sorted(previous.tracked):
                entry = previous.tracked[message_id]
                if not entry.persistent:
                    pair.dead_ids.append(message_id)
                    continue
                model_id = pair.model.push(entry.message, True)
                pair.tracked[message_id] = _Tracked(
                    entry.message, True, model_id, delivered=entry.delivered
                )
                pair.by_model_id[model_id] = message_id
        if then_drain:
            for name, pair in self.queues.items():
                for _ in range(pair.model.ready_count + 1):
                    self.pop(name)

    @invariant()
    def counts_match(self) -> None:
        if self.sut is None:
            return
        assert self.sut.healthy, "the backend reports unhealthy"
        for name, pair in self.queues.items():
            unacked = sum(entry.unacked for entry in pair.tracked.values())
            ready = len(pair.tracked) - unacked
            assert (pair.model.ready_count, pair.model.unacked_count) == (ready, unacked)
            _assert_counts(pair.sut, ready, unacked, f"for queue {name!r}")
            ready_bytes = _body_bytes(e.message for e in pair.tracked.values() if not e.unacked)
            assert pair.model.ready_bytes == ready_bytes
            _assert_ready_bytes(pair.sut, ready_bytes, f"for queue {name!r}")


def _machine_for(factory: BackendFactory, base_dir: Path | None) -> type[BackendStateMachine]:
    namespace = {"factory": staticmethod(factory), "base_dir": base_dir}
    return type("BackendStateMachineFor", (BackendStateMachine,), namespace)


def run_stateful(
    factory: BackendFactory,
    base_dir: Path | None = None,
    *,
    settings: settings | None = None,
) -> None:
    """Run the state machine against ``factory`` (each example in a fresh directory under
    ``base_dir``, default the system temporary directory); raises on a counterexample."""
    machine = _machine_for(factory, base_dir)
    run_state_machine_as_test(machine, settings=settings or stateful_settings())


def stateful_test_case(
    factory: BackendFactory, *, settings: settings | None = None
) -> type[unittest.TestCase]:
    """The state machine for ``factory`` as a ``unittest.TestCase`` class; assign it to a
    module-level ``Test...`` name to have unittest or pytest collect it."""
    test_case = _machine_for(factory, None).TestCase
    test_case.settings = settings or stateful_settings()
    return test_case


@_case()
def check_stateful(factory: BackendFactory, data_dir: Path) -> None:
    """The backend behaves like the in-memory model under random operation sequences,
    restarts included (see ``BackendStateMachine``)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    run_stateful(factory, data_dir)


# --- running the cases -----------------------------------------------------------------------


def run_conformance(
    factory: BackendFactory, directory: Path, *, skip: Sequence[str] = ()
) -> list[str]:
    """Run every case that applies to the factory's backend (each in its own subdirectory of
    ``directory``), except those named in ``skip``; return the names of the cases run. The first
    failure propagates."""
    durable = factory(directory).durable
    ran: list[str] = []
    for case in CASES:
        if case.name in skip or not case.applies(durable):
            continue
        case.function(factory, directory / case.name)
        ran.append(case.name)
    return ran


class BackendConformance:
    """Subclass as ``Test...`` and override ``make_backend`` to run every case under pytest (see
    the module docstring); ``known_failures`` maps case names to reasons (strict xfail)."""

    known_failures: ClassVar[Mapping[str, str]] = {}

    def make_backend(self, data_dir: Path) -> Backend:
        """A fresh, unopened backend for ``data_dir`` (the ``BackendFactory``): override this."""
        raise NotImplementedError(
            f"{type(self).__name__} overrides neither make_backend nor the conformance_factory"
            " fixture"
        )

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "conformance_case" not in metafunc.fixturenames:
            return
        unknown = set(self.known_failures) - {case.name for case in CASES}
        if unknown:
            raise ValueError(f"known_failures names unknown cases: {sorted(unknown)}")
        durable = self._durability()
        params = []
        for case in CASES:
            if durable is not None and not case.applies(durable):
                continue  # not applicable to this kind of backend: not generated at all
            reason = self.known_failures.get(case.name)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(case, id=case.name, marks=marks))
        metafunc.parametrize("conformance_case", params)

    def _durability(self) -> bool | None:
        """Whether ``make_backend`` builds a durable backend (None if it cannot tell, e.g.
        when a subclass parametrizes ``conformance_factory`` instead)."""
        with tempfile.TemporaryDirectory() as tmp:
            try:
                return bool(self.make_backend(Path(tmp)).durable)
            except NotImplementedError:
                return None

    @pytest.fixture
    def conformance_factory(self) -> BackendFactory:
        """The factory under test: ``make_backend`` unless a subclass overrides this fixture
        (e.g. with ``params`` to run one class against several backends)."""
        return self.make_backend

    def test_conformance(
        self,
        conformance_case: ConformanceCase,
        conformance_factory: BackendFactory,
        tmp_path: Path,
    ) -> None:
        durable = conformance_factory(tmp_path).durable
        if not conformance_case.applies(durable):
            pytest.skip(f"for {conformance_case.applies_to} backends only")
        conformance_case.function(conformance_factory, tmp_path / "data")
