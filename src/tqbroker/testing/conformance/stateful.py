"""The conformance suite's Hypothesis state machine: a backend driven side by side with the
in-memory reference backend (case ``stateful``)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import unittest
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ...backends.base import Backend, Popped, QueueStore
from ...backends.memory import MemoryBackend, MemoryQueueStore
from ...model import Message
from ...protocol.methods import BasicProperties
from .harness import (
    NEVER_ISSUED_ID,
    T0_MS,
    BackendFactory,
    CaseList,
    assert_counts,
    assert_flushed,
    assert_message,
    assert_ready_bytes,
    body_bytes,
    open_backend,
    peek,
    pop,
    run_flush,
    snapshot,
)

log = logging.getLogger(__name__)

STATEFUL_CASES = CaseList()
"""This module's cases, in the order they run."""
_case = STATEFUL_CASES.case


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
        before = snapshot(pair.sut)
        self._expect(pair, peek(self.backend, pair.sut), pair.model.peek(), "peek()")
        after = snapshot(pair.sut)
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
        assert_message(message, entry.message, f"message {message_id} from {call}")
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
        assert_flushed(self.backend)

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
            assert_counts(pair.sut, ready, unacked, f"for queue {name!r}")
            ready_bytes = body_bytes(e.message for e in pair.tracked.values() if not e.unacked)
            assert pair.model.ready_bytes == ready_bytes
            assert_ready_bytes(pair.sut, ready_bytes, f"for queue {name!r}")


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
