"""Conformance cases: what a store keeps and keeps apart (messages byte-exact with their
timestamps, priority levels over one store per level, queues isolated from each other, foreign
files in the data directory, ``delete_queue``)."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from pathlib import Path

from ...broker.priority import PriorityStore, level_store_names
from ...model import Message
from ...protocol.methods import BasicProperties
from .harness import (
    T0_MS,
    BackendFactory,
    BackendHarness,
    CaseList,
    assert_counts,
    assert_peek_then_pop,
    assert_popped,
    assert_ready_bytes,
    make_message,
    numbered,
)

log = logging.getLogger(__name__)

CONTENT_CASES = CaseList()
"""This module's cases, in the order they run."""
_case = CONTENT_CASES.case


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
            assert_popped(h.pop(store), message_id, message, False)
        for message_id in ids:
            store.requeue(message_id)
        for message_id, message in zip(ids, messages, strict=True):
            assert_peek_then_pop(h, store, message_id, message, True)
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
            assert_popped(h.pop(store), message_id, message, True)
        for message_id, message in zip(fresh, messages, strict=True):
            assert_popped(h.pop(store), message_id, message, False)


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
        assert_counts(store, 6, 0, "after six pushes over three levels")
        order = [n for n, _ in sorted(plan, key=lambda item: -min(item[1] or 0, 2))]
        assert order == [2, 3, 1, 4, 0, 5]
        first = h.peek(store)
        assert_popped(first, ids[2], _prioritised(2, 2), False, "peek()")
        assert_popped(h.pop(store), ids[2], _prioritised(2, 2), False)
        assert_popped(h.pop(store), ids[3], _prioritised(3, 9), False)
        store.requeue(ids[2])
        assert_popped(h.pop(store), ids[2], _prioritised(2, 2), True)
        store.ack(ids[2])
        store.ack(ids[3])
        for n in order[2:]:
            assert_popped(h.pop(store), ids[n], _prioritised(n, plan[n][1]), False)
        assert h.pop(store) is None
        assert_counts(store, 0, 4, "with every level delivered")
        assert_ready_bytes(store, 0, "with every level delivered")


@_case("durable")
def check_priority_levels_after_restart(factory: BackendFactory, data_dir: Path) -> None:
    """Persistent messages of a priority queue come back in priority order after a restart,
    those delivered before flagged redelivered."""
    with BackendHarness(factory, data_dir) as h:
        store = _priority_store(h)
        plan = [(0, 0), (1, 2), (2, 1), (3, 2)]
        ids = {n: store.push(_prioritised(n, p), persistent=True) for n, p in plan}
        assert_popped(h.pop(store), ids[1], _prioritised(1, 2), False)
        h.restart()
        store = _priority_store(h)
        assert_counts(store, 4, 0, "after the restart")
        for n, redelivered in ((1, True), (3, False), (2, False), (0, False)):
            assert_popped(h.pop(store), ids[n], _prioritised(n, plan[n][1]), redelivered)


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
            assert_counts(store, n + 2, 0, f"for queue {_QUEUE_NAMES[n]}")
        first, second = stores[0], stores[1]
        assert_popped(h.pop(first), *sent[0][0], False)
        assert_popped(h.pop(second), *sent[1][0], False)
        first.ack(sent[0][0][0])  # ids may coincide between stores: only first's goes
        assert_counts(second, 2, 1, "after an ack of the same id on another queue")
        second.requeue(sent[1][0][0])
        assert_counts(first, 1, 0, "after a requeue on another queue")
        assert second.purge() == 3
        assert_counts(first, 1, 0, "after a purge of another queue")
        del sent[0][0], sent[1][:]
        if h.durable:
            del store, stores, first, second
            h.restart()
            stores = [h.queue(queue, vhost) for vhost, queue in _QUEUE_NAMES]
        for n, store in enumerate(stores):
            assert_counts(store, len(sent[n]), 0, f"for queue {_QUEUE_NAMES[n]}")
            for message_id, message in sent[n]:
                assert_popped(h.pop(store), message_id, message, False)
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
        message = numbered(1)
        message_id = store.push(message, persistent=True)
        del store
        h.restart()
        store = h.queue()
        if h.durable:
            assert_popped(h.pop(store), message_id, message, False)
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
        ids = [doomed.push(numbered(n), persistent=True) for n in range(5)]
        kept_message = numbered(99)
        kept_id = kept.push(kept_message, persistent=True)
        h.pop(doomed)
        h.pop(doomed)
        h.flush()
        h.backend.delete_queue("/", "doomed")
        del doomed
        again = h.queue("doomed")
        assert_counts(again, 0, 0, "for a queue re-opened after delete_queue")
        assert h.pop(again) is None, "a re-opened queue handed out a deleted message"
        for message_id in ids:  # unknown in the new queue
            again.ack(message_id)
            again.requeue(message_id)
        assert_counts(again, 0, 0, "after ack/requeue of the deleted queue's ids")
        new = numbered(100)
        new_id = again.push(new, persistent=True)
        assert_popped(h.pop(again), new_id, new, False)
        assert_counts(kept, 1, 0, "for a queue of the same name in another vhost")
        assert_popped(h.pop(kept), kept_id, kept_message, False)
