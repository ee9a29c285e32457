"""The in-process three-node cluster driven by a list of steps Hypothesis generates (publish a
batch through a node, read everything a node serves, kill a node, restart the dead, cut a node
off, heal, let time pass, cut the power to every node, damage a follower's segment while it is
down), with the history checker as the property (``cluster.md`` §C and §D: a list of
operations, replayed in one Trio run, which shrinks well).

Time is ``SimClock``'s: the real clock, skipping the moments when every task waits and no worker
thread is busy (``trio.testing.MockClock`` cannot be used: its jumps while a flusher's thread
does I/O make every flush look stuck; ``sim_clock`` says why). The runs are not a
deterministic interleaving (threads finish in real time), but the schedule is: the default
test is derandomized (the same examples every run); ``-m slow`` explores more, under the seed
it prints (``TQBROKER_CLUSTER_SEED=N`` replays one: ``hypothesis.seed``).
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.support.cluster_history import CONFIRMED, NACKED, History, Publish, check
from tests.support.cluster_sim import Cluster, cluster, declare_stream, settled
from tests.support.cluster_workload import PARTITION, SEED_VARIABLE, take_replicas
from tests.support.sim_clock import SimClock
from tqbroker.cluster.follower import damage_of
from tqbroker.model import Message
from tqbroker.plugins.spec import Durability

NODES = 3
TestFunction = TypeVar("TestFunction", bound=Callable[..., Any])
PUBLISH_TIMEOUT = 15.0

Step = tuple[str, int]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 40)),  # through node n % live, 1 + n % 10
        st.tuples(st.just("read"), st.integers(0, NODES - 1)),  # through node n % live
        st.tuples(st.just("kill"), st.integers(0, NODES - 1)),
        st.tuples(st.just("restart"), st.just(0)),
        st.tuples(st.just("cut"), st.integers(0, NODES - 1)),
        st.tuples(st.just("heal"), st.just(0)),
        st.tuples(st.just("wait"), st.integers(1, 8)),  # tenths of the lease TTL
        st.tuples(st.just("power_cut"), st.just(0)),
        st.tuples(st.just("corrupt"), st.integers(0, NODES - 1)),
    ),
    min_size=1,
    max_size=12,
)


@attrs.define
class Run:
    made: Cluster
    history: History
    waiters: trio.Nursery  # the publishes waiting for their confirms
    waiting: list[trio.CancelScope] = attrs.field(factory=list)
    dead: list[str] = attrs.field(factory=list)
    corrupted: bool = False  # one damaged replica per run (two would leave one intact)
    batches: int = 0

    def live(self) -> list[str]:
        return sorted(self.made.members)


async def confirm(publish: Publish, durability: Durability, scope: trio.CancelScope) -> None:
    assert durability is not None  # a replicated partition's appends wait for their ISR
    commit, ticket = durability
    with scope, trio.move_on_after(PUBLISH_TIMEOUT):
        publish.outcome = CONFIRMED if await commit.wait(ticket) else NACKED


def publish(run: Run, n: int) -> None:
    """A batch of ``1 + n % 10`` messages through live node ``n % live``, one producer's."""
    live = run.live()
    name = live[n % len(live)]
    producer = f"b{run.batches}"
    run.batches += 1
    publishes = [Publish(producer, seq, PARTITION) for seq in range(1 + n % 10)]
    run.history.publishes.extend(publishes)
    try:
        _first, taken, _error = (
            run.made.members[name]
            .partition()
            .append([Message("", "s", b"", p.payload) for p in publishes])
        )
    except (KeyError, AssertionError):  # the stream is not open there yet
        taken = []
    for p in publishes[len(taken) :]:
        p.outcome = NACKED
    for p, durability in zip(publishes, taken, strict=False):
        scope = trio.CancelScope()
        run.waiting.append(scope)
        run.waiters.start_soon(confirm, p, durability, scope)


def read(run: Run, n: int) -> None:
    """A consumer's read of everything live node ``n % live`` serves (below its high
    watermark), each record a delivery in the history."""
    live = run.live()
    name = live[n % len(live)]
    try:
        records = run.made.members[name].partition().read_many(0, 1 << 20)
    except (KeyError, AssertionError, OSError):  # not open there yet, or its log damaged
        return
    consumer = f"c{name}"
    for record in records:
        run.history.deliveries.append((consumer, PARTITION, record.offset, record.message.body))


async def corrupt(run: Run, n: int, rng: random.Random) -> None:
    """Node ``n`` (if up and not the only one up) stops; four bytes in the middle third of its
    first segment flip; it starts again on it."""
    name = f"n{n}"
    made = run.made
    if run.corrupted or name not in made.members or len(made.members) < 2:
        return
    made.kill(name)
    await made.wait_stopped(name)
    segment = made.segment_files(name)[0]
    data = bytearray(segment.read_bytes())
    if len(data) >= 256:
        at = rng.randrange(len(data) // 3, 2 * len(data) // 3)
        for i in range(at, at + 4):
            data[i] ^= 0xFF
        segment.write_bytes(bytes(data))
        run.corrupted = True
    await made.start(name)


async def step(run: Run, action: str, n: int, rng: random.Random) -> None:
    made = run.made
    ttl = made.members[run.live()[0]].node.settings.lease_ttl if made.members else 3
    if action == "publish" and made.members:
        publish(run, n)
    elif action == "read" and made.members:
        read(run, n)
    elif action == "kill" and f"n{n}" in made.members and len(made.members) > 1:
        made.kill(f"n{n}")
        run.dead.append(f"n{n}")
    elif action == "restart":
        for name in run.dead:
            await made.start(name)
        run.dead.clear()
    elif action == "cut" and f"n{n}" in made.members:
        made.cut.add(f"n{n}")
    elif action == "heal":
        made.cut.clear()
    elif action == "wait":
        await trio.sleep(ttl * n / 10)
    elif action == "power_cut":
        for scope in run.waiting:  # in the same step: no outcome decided after the power went
            scope.cancel()
        run.waiting.clear()
        running = made.power_cut_now()
        await made.restore_power(running)
    elif action == "corrupt":
        await corrupt(run, n, rng)


def intact_in_sync(made: Cluster) -> bool:
    """A leader whose ISR is every live intact replica, at its log's end, as all of them."""
    intact = {n for n, m in made.members.items() if damage_of(m.partition()) is None}
    leader = made.leader()
    return (
        leader is not None
        and set(leader.isr) == intact
        and leader.high_watermark == leader.partition.log_end_offset
        and all(made.members[n].partition().high_watermark == leader.high_watermark for n in intact)
    )


async def run_steps(tmp_path: Path, clock: SimClock, schedule: list[Step]) -> History:
    print(f"steps: {schedule}")
    history = History()
    rng = random.Random(repr(schedule))
    async with cluster(tmp_path, disks=True) as made:
        clock.busy = made.flushing
        await declare_stream(made)
        await settled(made, lambda: intact_in_sync(made))
        async with trio.open_nursery() as waiters:
            run = Run(made, history, waiters)
            for action, n in schedule:
                await step(run, action, n, rng)
            made.cut.clear()
            for name in run.dead:
                await made.start(name)
        await settled(made, lambda: intact_in_sync(made))
        leader = made.leader()
        assert leader is not None
        take_replicas(made, history, leader.isr)
    return history


_examples = itertools.count()


@pytest.fixture
def sim_clock() -> SimClock:
    return SimClock()  # pytest-trio runs the test on a Clock fixture


def replay(test: TestFunction) -> TestFunction:
    """``TQBROKER_CLUSTER_SEED``: Hypothesis runs under that seed."""
    if SEED_VARIABLE in os.environ:
        return seed(int(os.environ[SEED_VARIABLE]))(test)
    return test


@settings(
    max_examples=8,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=steps)
async def test_any_list_of_steps_passes_the_checker(
    tmp_path: Path, sim_clock: SimClock, schedule: list[Step]
) -> None:
    history = await run_steps(tmp_path / str(next(_examples)), sim_clock, schedule)
    assert check(history) == [], f"steps {schedule}"


@pytest.mark.slow
@replay
@settings(
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)
@given(schedule=steps)
async def test_many_lists_of_steps_pass_the_checker(
    tmp_path: Path, sim_clock: SimClock, schedule: list[Step]
) -> None:
    history = await run_steps(tmp_path / str(next(_examples)), sim_clock, schedule)
    assert check(history) == [], f"steps {schedule}"
