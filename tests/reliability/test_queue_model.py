"""A stateful model of a classic queue on every backend (RabbitMQ's ``classic_queue_prop_SUITE``
ported to a Hypothesis ``RuleBasedStateMachine``; the model is ``tests/queue_model.py``).

One pika connection over loopback carries every channel (so the broker handles the client's
frames in the order they were sent: an ack sent before a publish is applied before it), plus a
control channel for passive declares, purges and the drain after a crash. After every rule the
machine waits for exactly the deliveries the model predicts (its consumers' free prefetch,
filled from the oldest ready messages) and checks them: each a message the model holds ready,
the oldest ones, in order per consumer, with the right body, persistence and redelivered flag;
then ``message_count`` from a passive declare must match the model.

Restarts (log and rocksdb backends): a clean one is SIGTERM of the broker's process and a new
process on the same data directory; a dirty one is SIGKILL of the process (a real crash: what
the process had not written is lost, what it had written stays in the page cache -- a power cut
is item 5's simulation, not this test's). An in-process broker cannot be abandoned without its
``finally`` blocks closing and flushing files, which a crash would not do, so both restarts use
a child process (forked from a server that has imported the broker once: ``ForkServer``).

Run: ``pytest tests/reliability/test_queue_model.py`` (20 examples x 30 steps per backend, at
most 2 restarts each; ``TQ_MODEL_EXAMPLES=N`` for more) or ``-m slow`` (200 x 50, 4 restarts).
The crash cases the model found are pinned in ``test_crash_cases.py``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky, HypothesisException
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.queue_model import (
    UNACKED,
    Chan,
    ForkServer,
    ModelBroker,
    ModelViolation,
    QueueModel,
    body_for,
    deliveries_by_consumer,
)

BACKENDS = ["memory", "log", "rocksdb"]
MAX_CHANNELS = 3
SIZES = st.one_of(st.sampled_from([0, 1, 4096, 65536]), st.integers(0, 65536))
MESSAGES = st.lists(st.tuples(st.booleans(), SIZES), min_size=1, max_size=4)  # persistent, size
PICK = st.integers(0, 63)  # which channel / which delivery, modulo how many there are
DELIVERY_TIMEOUT = 5.0


class QueueMachine(RuleBasedStateMachine):
    broker: ModelBroker  # set by machine_for()
    max_restarts = 2
    stats: Counter[str]  # what the runs did, for the summary line
    failures: list[str]  # the first exception a run raised, for a report of a Flaky error

    def __init__(self) -> None:
        super().__init__()
        if not self.broker.running:  # an earlier run failed in a restart: begin as it did
            self.broker.start()
        self.model = QueueModel()
        self.queue = f"model-{uuid.uuid4().hex[:12]}"
        self.restarts = 0
        self.inbox: list[tuple[int, str, int, bool, bytes, pika.BasicProperties]] = []
        self.chans: dict[int, Chan] = {}
        self._connect()
        self.control.queue_declare(
            self.queue, durable=True, arguments={"x-queue-backend": self.broker.backend}
        )

    def _connect(self) -> None:
        self.conn = self.broker.connect()
        self.control = self.conn.channel()
        self.chans = {}

    def teardown(self) -> None:
        # Called in Hypothesis' ``finally``: exc_info is what the run raised, if it failed.
        error = sys.exc_info()[1]
        ours = isinstance(error, Exception) and not isinstance(error, HypothesisException)
        if ours and not self.failures:
            self.failures.append("".join(traceback.format_exception(error)))
        try:
            if self.conn.is_open:
                self.conn.channel().queue_delete(self.queue)
                self.conn.close()
        except pika.exceptions.AMQPError:
            pass

    # -- helpers -----------------------------------------------------------------------------

    # Preconditions depend only on what the rules drew (channels, consumers, publishes), never
    # on what a crash kept: Hypothesis replays a draw sequence and needs the same rules enabled.
    # They are named functions, not lambdas: Hypothesis describes a lambda precondition by
    # parsing its source (ast.parse) the first time it checks it, and on CPython 3.11 that
    # parse can fail spuriously in a process with threads (gh-106905, "AST constructor
    # recursion depth mismatch"), a failure a replay does not repeat.

    def _may_open(self) -> bool:
        return len(self.chans) < MAX_CHANNELS

    def _has_channels(self) -> bool:
        return bool(self.chans)

    def _has_idle_channel(self) -> bool:
        return any(c.consumer is None for c in self.chans.values())

    def _has_consumer(self) -> bool:
        return any(c.consumer is not None for c in self.chans.values())

    def _chan(self, pick: int) -> tuple[int, Chan]:
        keys = sorted(self.chans)
        key = keys[pick % len(keys)]
        return key, self.chans[key]

    def _unacked_chan(self, pick: int) -> Chan | None:
        """A channel holding unacked deliveries (None: no channel holds any)."""
        keys = sorted(k for k, c in self.chans.items() if c.unacked)
        return self.chans[keys[pick % len(keys)]] if keys else None

    def _on_message(self, key: int) -> object:
        def on_message(
            _ch: BlockingChannel, method: object, props: pika.BasicProperties, body: bytes
        ) -> None:
            assert isinstance(method, pika.spec.Basic.Deliver)
            tag = method.consumer_tag
            self.inbox.append((key, tag, method.delivery_tag, method.redelivered, body, props))

        return on_message

    def _check_content(self, msg_id: int, body: bytes, props: pika.BasicProperties) -> None:
        m = self.model.msgs[msg_id]
        if body != body_for(msg_id, m.size):
            raise ModelViolation(f"message {msg_id}: body of {len(body)} bytes differs")
        if (props.delivery_mode == 2) != m.persistent:
            raise ModelViolation(f"message {msg_id}: delivery_mode {props.delivery_mode}")

    def settle(self) -> None:
        """Wait for the deliveries the model predicts, then check them."""
        ready = self.model.ready()
        credit = sum(c.credit() for c in self.chans.values())
        expected = int(min(len(ready), credit))
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while len(self.inbox) < expected:
            if time.monotonic() > deadline:
                raise ModelViolation(f"expected {expected} deliveries, got {len(self.inbox)}")
            self.conn.process_data_events(time_limit=0.005)
        self.conn.process_data_events(time_limit=0)
        batch, self.inbox = self.inbox, []
        ids = [int(props.message_id) for *_rest, props in batch]
        if len(ids) > expected or sorted(ids) != ready[: len(ids)]:
            raise ModelViolation(f"deliveries {ids}; the model expected {ready[:expected]}")
        pairs = zip(batch, ids, strict=True)
        for each in deliveries_by_consumer([(k, t, i) for (k, t, *_r), i in pairs]):
            if each != sorted(each):
                raise ModelViolation(f"one consumer received {each}: out of order")
        for (key, ctag, tag, redelivered, body, props), msg_id in zip(batch, ids, strict=True):
            chan = self.chans[key]
            if chan.consumer != ctag or chan.credit() < 1:
                raise ModelViolation(f"message {msg_id} delivered to {ctag} without credit")
            self._check_content(msg_id, body, props)
            self.model.deliver(msg_id, redelivered)
            chan.unacked[tag] = (msg_id, ctag)
            self.stats["deliver"] += 1
            self.stats["redelivered"] += redelivered

    def message_count(self) -> int:
        frame = self.control.queue_declare(self.queue, passive=True)
        return int(frame.method.message_count)

    # -- channels ----------------------------------------------------------------------------

    @precondition(_may_open)
    @rule(confirm=st.booleans())
    def open_channel(self, confirm: bool) -> None:
        ch = self.conn.channel()
        if confirm:
            ch.confirm_delivery()
        self.chans[ch.channel_number] = Chan(ch, confirm)

    @precondition(_has_channels)
    @rule(pick=PICK)
    def close_channel(self, pick: int) -> None:
        key, chan = self._chan(pick)
        chan.ch.close()
        del self.chans[key]
        for msg_id, _consumer in chan.unacked.values():
            self.model.requeue(msg_id)
        self.settle()

    # -- publishing and getting --------------------------------------------------------------

    @initialize(confirm=st.booleans(), messages=MESSAGES)
    def start(self, confirm: bool, messages: list[tuple[bool, int]]) -> None:
        self.open_channel(confirm)
        self.publish(0, messages)

    @precondition(_has_channels)
    @rule(pick=PICK, messages=MESSAGES)
    def publish(self, pick: int, messages: list[tuple[bool, int]]) -> None:
        _key, chan = self._chan(pick)
        for persistent, size in messages:
            msg_id = self.model.publish(size, persistent)
            mode = 2 if persistent else 1
            props = pika.BasicProperties(message_id=str(msg_id), delivery_mode=mode)
            chan.ch.basic_publish("", self.queue, body_for(msg_id, size), props)
            if chan.confirm:  # pika waited for the ack (a nack would have raised NackError)
                self.model.confirmed(msg_id)
            self.stats["publish"] += 1
        self.settle()

    @precondition(_has_channels)
    @rule(pick=PICK, auto_ack=st.booleans())
    def get(self, pick: int, auto_ack: bool) -> None:
        _key, chan = self._chan(pick)
        method, props, body = chan.ch.basic_get(self.queue, auto_ack=auto_ack)
        ready = self.model.ready()
        if method is None:
            if ready:
                raise ModelViolation(f"basic.get-empty; the model holds {ready} ready")
            return
        msg_id = int(props.message_id)
        if not ready or msg_id != ready[0]:
            raise ModelViolation(f"basic.get returned {msg_id}; the model expected {ready[:1]}")
        self._check_content(msg_id, body, props)
        self.model.deliver(msg_id, method.redelivered, settle=auto_ack)
        self.stats["get"] += 1
        if not auto_ack:
            chan.unacked[method.delivery_tag] = (msg_id, None)
        self.settle()

    # -- consumers ---------------------------------------------------------------------------

    @precondition(_has_idle_channel)
    @rule(pick=PICK, prefetch=st.sampled_from([0, 1, 2, 3]))
    def consume(self, pick: int, prefetch: int) -> None:
        keys = sorted(k for k, c in self.chans.items() if c.consumer is None)
        chan = self.chans[keys[pick % len(keys)]]
        chan.ch.basic_qos(prefetch_count=prefetch)
        chan.prefetch = prefetch
        on_message = self._on_message(chan.ch.channel_number)
        chan.consumer = chan.ch.basic_consume(self.queue, on_message)
        self.settle()

    @precondition(_has_consumer)
    @rule(pick=PICK)
    def cancel(self, pick: int) -> None:
        keys = sorted(k for k, c in self.chans.items() if c.consumer is not None)
        chan = self.chans[keys[pick % len(keys)]]
        assert chan.consumer is not None
        chan.ch.basic_cancel(chan.consumer)
        chan.consumer = None

    # -- settling ----------------------------------------------------------------------------

    def _tags(self, chan: Chan, pick: int, multiple: bool) -> list[int]:
        tags = sorted(chan.unacked)
        tag = tags[pick % len(tags)]
        return [t for t in tags if t <= tag] if multiple else [tag]

    def _take(self, chan: Chan, tags: list[int]) -> list[int]:
        return [chan.unacked.pop(t)[0] for t in tags]

    @precondition(_has_channels)
    @rule(pick=PICK, which=PICK, multiple=st.booleans())
    def ack(self, pick: int, which: int, multiple: bool) -> None:
        chan = self._unacked_chan(pick)
        if chan is None:
            return
        tags = self._tags(chan, which, multiple)
        chan.ch.basic_ack(tags[-1], multiple=multiple)
        for msg_id in self._take(chan, tags):
            self.model.settle(msg_id)
        self.settle()

    @precondition(_has_channels)
    @rule(pick=PICK, which=PICK, multiple=st.booleans(), requeue=st.booleans())
    def nack(self, pick: int, which: int, multiple: bool, requeue: bool) -> None:
        chan = self._unacked_chan(pick)
        if chan is None:
            return
        tags = self._tags(chan, which, multiple)
        chan.ch.basic_nack(tags[-1], multiple=multiple, requeue=requeue)
        for msg_id in self._take(chan, tags):
            (self.model.requeue if requeue else self.model.settle)(msg_id)
        self.settle()

    @precondition(_has_channels)
    @rule(pick=PICK, which=PICK, requeue=st.booleans())
    def reject(self, pick: int, which: int, requeue: bool) -> None:
        chan = self._unacked_chan(pick)
        if chan is None:
            return
        tags = self._tags(chan, which, False)
        chan.ch.basic_reject(tags[0], requeue=requeue)
        for msg_id in self._take(chan, tags):
            (self.model.requeue if requeue else self.model.settle)(msg_id)
        self.settle()

    @precondition(_has_channels)
    @rule(pick=PICK)
    def recover(self, pick: int) -> None:
        chan = self._unacked_chan(pick)
        if chan is None:
            return
        chan.ch.basic_recover(requeue=True)
        for msg_id in self._take(chan, sorted(chan.unacked)):
            self.model.requeue(msg_id)
        self.settle()

    @rule()
    def purge(self) -> None:
        frame = self.control.queue_purge(self.queue)
        expected = self.model.purge()
        if frame.method.message_count != expected:
            raise ModelViolation(f"purge-ok says {frame.method.message_count}, model {expected}")

    # -- restarts ----------------------------------------------------------------------------

    def _can_restart(self) -> bool:
        published = self.model.next_id > 1
        return self.broker.restartable and self.restarts < self.max_restarts and published

    def _requeue_all(self) -> None:
        for chan in self.chans.values():
            for msg_id, _consumer in chan.unacked.values():
                self.model.requeue(msg_id)
        self.inbox = []

    @precondition(_can_restart)
    @rule()
    def restart_clean(self) -> None:
        self.restarts += 1
        self.stats["clean restart"] += 1
        self.message_count()  # a round trip: every frame sent before it has been handled
        self.broker.stop(lambda: self.conn.process_data_events(time_limit=0.01))
        self._requeue_all()
        self.model.clean_restart()
        self.broker.start()
        self._connect()

    @precondition(_can_restart)
    @rule()
    def restart_dirty(self) -> None:
        self.restarts += 1
        self.stats["dirty restart"] += 1
        self.broker.kill()
        self._requeue_all()
        must, may = self.model.crash()
        self.broker.start()
        self._connect()
        count = self.message_count()
        if not len(must) <= count <= len(must) + len(may):
            raise ModelViolation(f"{count} messages after a crash: must {must}, may {may}")
        if count == len(must):
            present = must
        elif count == len(must) + len(may):
            present = must | may
        else:
            present = self._drain(count, must | may)
            if not must <= present:
                raise ModelViolation(f"lost after a crash: {sorted(must - present)}")
        self.model.recovered(present)
        self.stats["came back though acked"] += sum(
            1 for i in present & may if self.model.msgs[i].delivered
        )
        self.stats["ambiguous crash"] += len(must) < count < len(must) + len(may)

    def _drain(self, count: int, allowed: set[int]) -> set[int]:
        """Which messages came back: get them all, check them, requeue them."""
        got: list[int] = []
        for _ in range(count):
            method, props, body = self.control.basic_get(self.queue)
            if method is None:
                raise ModelViolation(f"basic.get-empty after {got} of {count} messages")
            msg_id = int(props.message_id)
            if msg_id not in allowed or (got and msg_id < got[-1]):
                raise ModelViolation(f"after a crash: {msg_id} after {got}; allowed {allowed}")
            self._check_content(msg_id, body, props)
            m = self.model.msgs[msg_id]
            if m.delivered and not method.redelivered:
                raise ModelViolation(f"message {msg_id} came back from a crash unflagged")
            m.delivered = True  # requeued just below
            got.append(msg_id)
        if got:
            self.control.basic_nack(0, multiple=True, requeue=True)
        return set(got)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def count_matches(self) -> None:
        self.stats["steps"] += 1
        count, expected = self.message_count(), len(self.model.ready())
        if count != expected:
            raise ModelViolation(f"message_count {count}, the model has {expected} ready")

    @invariant()
    def states_consistent(self) -> None:
        held = sorted(i for c in self.chans.values() for i, _c in c.unacked.values())
        assert held == sorted(i for i, m in self.model.msgs.items() if m.state == UNACKED)


def machine_for(broker: ModelBroker, restarts: int) -> type[QueueMachine]:
    attributes = {
        "broker": broker,
        "max_restarts": restarts,
        "stats": Counter[str](),
        "failures": [],
    }
    return type("QueueMachineOn" + broker.backend.title(), (QueueMachine,), attributes)


@pytest.fixture(params=BACKENDS)
def model_broker(
    request: pytest.FixtureRequest, tmp_path: Path, fork_server: ForkServer
) -> Iterator[ModelBroker]:
    broker = ModelBroker(request.param, tmp_path / "data", fork_server)
    yield broker
    broker.close()


def run_model(broker: ModelBroker, examples: int, steps: int, restarts: int) -> None:
    began = time.monotonic()
    machine = machine_for(broker, restarts)
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                # TQ_MODEL_NO_SHRINK=1: report the first failure as found (shrinking a run
                # with restarts can take minutes; useful for mutation checks)
                phases=[Phase.generate] if os.environ.get("TQ_MODEL_NO_SHRINK") else list(Phase),
            ),
        )
    except Flaky as err:
        # A failure that a replay of the same steps did not repeat (in a stateful test,
        # Hypothesis reports it as "Inconsistent data generation"): show the failure itself.
        if machine.failures:
            err.add_note(
                "The first failure, which a replay did not repeat:\n" + machine.failures[0]
            )
        raise
    stats = ", ".join(f"{k} {v}" for k, v in sorted(machine.stats.items()))
    print(
        f"\n{broker.backend}: {examples} examples x {steps} steps in "
        f"{time.monotonic() - began:.1f} s ({broker.starts} broker starts, "
        f"{broker.start_seconds:.1f} s of them); {stats}"
    )


def test_queue_model(model_broker: ModelBroker) -> None:
    examples = int(os.environ.get("TQ_MODEL_EXAMPLES", "20"))
    run_model(model_broker, examples, steps=30, restarts=2)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_queue_model_long(model_broker: ModelBroker) -> None:
    run_model(model_broker, examples=200, steps=50, restarts=4)
