"""Checks of the conformance suite itself: it passes on a toy durable backend (so its durable
half runs before the real durable backends plug in) and fails on backends with known bugs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from tqbroker.backends.memory import MemoryBackend, MemoryQueueStore
from tqbroker.model import Message
from tqbroker.testing.conformance import (
    CASES,
    BackendConformance,
    BackendFactory,
    run_stateful,
    stateful_settings,
)

from .journal_backend import JournalBackend


class TestJournalBackend(BackendConformance):
    def make_backend(self, data_dir: Path) -> JournalBackend:
        return JournalBackend()


# --- broken backends: each bug must be caught by the named cases ------------------------------


class _LifoStore(MemoryQueueStore):
    def pop(self) -> tuple[int, Message, bool] | None:
        if self._requeued or not self._ready:
            return super().pop()
        message = self._ready.pop()
        message_id = self._head_id + len(self._ready)  # ids are consecutive from the head
        self._messages[message_id] = message
        self._unacked.add(message_id)
        return message_id, message, False


class _UnflaggedRequeueStore(MemoryQueueStore):
    def pop(self) -> tuple[int, Message, bool] | None:
        popped = super().pop()
        return None if popped is None else (popped[0], popped[1], False)


class _PurgeCountsUnackedStore(MemoryQueueStore):
    def purge(self) -> int:
        return super().purge() + self.unacked_count


class _PeekPopsStore(MemoryQueueStore):
    def peek(self) -> tuple[int, Message, bool] | None:
        return self.pop()


class _PeekIgnoresRequeuedStore(MemoryQueueStore):
    def peek(self) -> tuple[int, Message, bool] | None:
        if self._ready:
            return self._head_id, self._ready[0], False
        return super().peek()


class _RequeueForgetsBytesStore(MemoryQueueStore):
    def requeue(self, message_id: int) -> None:
        before = self._ready_bytes
        super().requeue(message_id)
        self._ready_bytes = before


class _DropsTimestampStore(MemoryQueueStore):
    def pop(self) -> tuple[int, Message, bool] | None:
        popped = super().pop()
        if popped is None:
            return None
        message_id, m, redelivered = popped
        return message_id, Message(m.exchange, m.routing_key, m.properties_raw, m.body), redelivered


class _MemoryWith(MemoryBackend):
    store_class: type[MemoryQueueStore] = MemoryQueueStore

    def open_queue(self, vhost: str, queue: str) -> MemoryQueueStore:
        return self._stores.setdefault((vhost, queue), self.store_class())


def _memory_with(store_class: type[MemoryQueueStore]) -> BackendFactory:
    backend_class = type("Broken", (_MemoryWith,), {"store_class": store_class})
    return lambda data_dir: backend_class()


class _NoDeliverRecord(JournalBackend):
    def write(self, kind: str, key: tuple[str, str], *args: Any, dirty: bool = True) -> None:
        if kind != "deliver":
            super().write(kind, key, *args, dirty=dirty)


class _ReusesIds(JournalBackend):
    def open(self, data_dir: Path) -> None:
        super().open(data_dir)
        for store in self._stores.values():
            store.next_id = max(store.entries, default=0) + 1


class _KeepsTransient(JournalBackend):
    def write(self, kind: str, key: tuple[str, str], *args: Any, dirty: bool = True) -> None:
        if kind == "id":
            kind, args = "push", (*args, "ex", "rk", "0000", "", 1)
        super().write(kind, key, *args, dirty=dirty)


class _ForgetsTimestamps(JournalBackend):
    def write(self, kind: str, key: tuple[str, str], *args: Any, dirty: bool = True) -> None:
        if kind == "push":
            args = (*args[:-1], 0)
        super().write(kind, key, *args, dirty=dirty)


class _AlwaysNeedsFlush(JournalBackend):
    def begin_flush(self) -> Callable[[], None] | None:
        work = super().begin_flush()
        self._dirty = True
        return work or (lambda: None)


class _LosesUnackedOnClose(JournalBackend):
    def close(self) -> None:
        for (vhost, queue), store in self._stores.items():
            for message_id in store.unacked:
                self.write("ack", (vhost, queue), message_id)
        super().close()


MUTANTS: list[tuple[str, BackendFactory, list[str]]] = [
    ("lifo", _memory_with(_LifoStore), ["pop_order", "requeue_order", "stateful"]),
    ("unflagged", _memory_with(_UnflaggedRequeueStore), ["requeue_order", "stateful"]),
    ("purge_count", _memory_with(_PurgeCountsUnackedStore), ["purge", "stateful"]),
    ("peek_pops", _memory_with(_PeekPopsStore), ["peek", "stateful"]),
    ("peek_ignores_requeued", _memory_with(_PeekIgnoresRequeuedStore), ["peek", "stateful"]),
    ("requeue_forgets_bytes", _memory_with(_RequeueForgetsBytesStore), ["ready_bytes", "stateful"]),
    ("drops_timestamp", _memory_with(_DropsTimestampStore), ["timestamps_round_trip", "stateful"]),
    (
        "forgets_timestamps",
        lambda data_dir: _ForgetsTimestamps(),
        ["timestamps_round_trip", "ready_bytes_after_restart", "stateful"],
    ),
    (
        "no_deliver_record",
        lambda data_dir: _NoDeliverRecord(),
        ["redelivered_flag_after_restart", "crash_redelivers_popped", "stateful"],
    ),
    ("reuses_ids", lambda data_dir: _ReusesIds(), ["ids_not_reused_after_restart", "stateful"]),
    (
        "keeps_transient",
        lambda data_dir: _KeepsTransient(),
        ["transient_dropped_on_restart", "crash_keeps_flushed_persistent", "stateful"],
    ),
    ("always_needs_flush", lambda data_dir: _AlwaysNeedsFlush(), ["flush_protocol", "stateful"]),
    (
        "loses_unacked",
        lambda data_dir: _LosesUnackedOnClose(),
        ["acked_gone_after_clean_restart", "redelivered_flag_after_restart", "stateful"],
    ),
]


@pytest.mark.parametrize(
    ("factory", "case_name"),
    [
        pytest.param(factory, case_name, id=f"{mutant}-{case_name}")
        for mutant, factory, case_names in MUTANTS
        for case_name in case_names
    ],
)
def test_suite_catches(factory: BackendFactory, case_name: str, tmp_path: Path) -> None:
    (case,) = [case for case in CASES if case.name == case_name]
    check = case.function
    if case_name == "stateful":
        check = _run_stateful_for_mutant
    with pytest.raises(AssertionError):
        check(factory, tmp_path)


def _run_stateful_for_mutant(factory: BackendFactory, data_dir: Path) -> None:
    # No shrinking (only the failure matters) and no example database (these counterexamples
    # must not be replayed against real backends). Not derandomized: the derandomized sequence
    # depended on which other test modules were collected, and with some collections it never
    # requeued before peeking, so a mutant went unseen; random sequences find every mutant
    # within a few examples (200 is the cap), nearly always: a mutant gets three runs (one in a
    # few hundred missed it).
    for attempt in range(3):
        (data_dir / str(attempt)).mkdir()
        run_stateful(factory, data_dir / str(attempt), settings=_MUTANT_SETTINGS)


_MUTANT_SETTINGS = settings(
    stateful_settings(max_examples=200),
    database=None,
    derandomize=False,
    phases=[Phase.explicit, Phase.generate],
)
