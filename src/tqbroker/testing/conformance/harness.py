"""The conformance suite's harness: running a backend as the broker does, and asserting.

Responsibilities: ``open_backend``, ``run_flush``, ``pop`` and ``peek`` as the broker calls them;
``make_message``; the assertions the cases share; ``BackendHarness`` (one backend across
restarts and crashes); ``ConformanceCase`` and ``CaseList`` (how cases are registered).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from ...backends.base import FLUSH_FIRST, Backend, FlushFirst, Popped, QueueStore
from ...backends.streams import StreamBackend, StreamLog
from ...model import Message
from ...protocol.methods import BasicProperties

log = logging.getLogger(__name__)

BackendFactory = Callable[[Path], Backend]
"""Returns a fresh, unopened backend for ``data_dir`` (the suite calls ``open`` itself)."""


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
    backend: Backend, store: QueueStore, call: Callable[[], Popped | FlushFirst | None], name: str
) -> Popped | None:
    """``call()``, and when it returns ``FLUSH_FIRST`` (the contract allows it only while the
    backend ``needs_flush``), a flush and ``call()`` again. ``None`` only when nothing is
    ready."""
    got = call()
    if got is FLUSH_FIRST:
        assert backend.needs_flush, f"{name}() returned FLUSH_FIRST but needs_flush is false"
        assert run_flush(backend), "needs_flush is true but begin_flush() returned None"
        got = call()
        assert got is not FLUSH_FIRST, f"{name}() still returned FLUSH_FIRST after a flush"
    assert got is not None or store.ready_count == 0, (
        f"{name}() returned None with {store.ready_count} ready messages (FLUSH_FIRST says "
        "'flush first')"
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


def numbered(n: int) -> Message:
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


def assert_message(actual: Message, expected: Message, what: str = "message") -> None:
    assert _same_message(actual, expected), (
        f"{what} differs:\n  got      {_describe(actual)}\n  expected {_describe(expected)}"
    )


def assert_popped(
    popped: Popped | None,
    message_id: int,
    message: Message,
    redelivered: bool,
    call: str = "pop()",
) -> None:
    assert popped is not None, f"{call} returned None, expected id {message_id}"
    got_id, got_message, got_redelivered = popped
    assert got_id == message_id, f"{call} returned id {got_id}, expected {message_id}"
    assert_message(got_message, message, f"message {message_id} from {call}")
    assert got_redelivered is redelivered, (
        f"message {message_id} from {call}: redelivered={got_redelivered!r}, expected"
        f" {redelivered!r}"
    )


def snapshot(store: QueueStore) -> tuple[int, int, int]:
    return store.ready_count, store.unacked_count, store.ready_bytes


def assert_peek_then_pop(
    h: BackendHarness, store: QueueStore, message_id: int, message: Message, redelivered: bool
) -> None:
    """``peek`` (twice) shows the expected next message and changes no count; ``pop`` then
    takes that message."""
    before = snapshot(store)
    for _ in range(2):
        assert_popped(h.peek(store), message_id, message, redelivered, "peek()")
        after = snapshot(store)
        assert after == before, (
            f"(ready_count, unacked_count, ready_bytes) went from {before} to {after} on peek()"
        )
    assert_popped(h.pop(store), message_id, message, redelivered)


def assert_counts(store: QueueStore, ready: int, unacked: int, when: str = "") -> None:
    got = (store.ready_count, store.unacked_count)
    suffix = f" {when}" if when else ""
    assert got == (ready, unacked), (
        f"(ready_count, unacked_count) = {got}{suffix}, expected {(ready, unacked)}"
    )


def assert_ready_bytes(store: QueueStore, expected: int, when: str) -> None:
    got = store.ready_bytes
    assert got == expected, f"ready_bytes = {got} {when}, expected {expected}"


def body_bytes(messages: Iterable[Message]) -> int:
    return sum(len(message.body) for message in messages)


def assert_flushed(backend: Backend) -> None:
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

    def stream(self, stream: str = "s", vhost: str = "/") -> StreamLog:
        """The log of a stream (for a backend that offers streams)."""
        backend = self.backend
        assert isinstance(backend, StreamBackend), f"{backend.name} offers no streams"
        return backend.open_stream(vhost, stream)

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
AppliesTo = Literal["all", "durable", "non-durable", "streams"]


@dataclass(frozen=True)
class ConformanceCase:
    """One check: ``function(factory, data_dir)``; ``applies_to`` says for which backends
    (``streams``: those that offer streams, ``StreamBackend``)."""

    name: str
    function: CaseFunction
    applies_to: AppliesTo

    def applies(self, durable: bool, streams: bool = False) -> bool:
        if self.applies_to == "all":
            return True
        if self.applies_to == "streams":
            return streams
        return durable == (self.applies_to == "durable")


class CaseList(list[ConformanceCase]):
    """The cases of one module, in the order they run; ``case`` registers a ``check_*``
    function (its name without the prefix is the case name)."""

    def case(self, applies_to: AppliesTo = "all") -> Callable[[CaseFunction], CaseFunction]:
        def register(function: CaseFunction) -> CaseFunction:
            name = function.__name__.removeprefix("check_")
            self.append(ConformanceCase(name, function, applies_to))
            return function

        return register
