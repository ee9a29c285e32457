"""The read budget (``broker/read_budget.py``) on its own, under Trio's mock clock where time
matters: reservations in order within the limit, a piece larger than the whole budget let in
alone, a waiter that is cancelled leaving the queue; new reads waiting while the memory alarm
is set and refused past the budget's patience; a body's pieces reserved one at a time, a piece
that outgrew its reservation built again under its size, and everything given back on close."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tqbroker.broker.alarms import MEMORY, ResourceAlarms
from tqbroker.broker.read_budget import (
    SLICE_BYTES,
    LowOnMemory,
    Piece,
    ReadBody,
    ReadBudget,
    budget_for,
)

MIB = 1024 * 1024


async def test_reservations_wait_in_order_within_the_limit() -> None:
    budget = ReadBudget(100)
    granted: list[str] = []

    async def reserve(name: str, size: int) -> None:
        await budget.reserve(size)
        granted.append(name)

    await budget.reserve(60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reserve, "big", 50)  # does not fit beside the 60
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(reserve, "small", 10)  # would fit, but waits behind "big"
        await trio.testing.wait_all_tasks_blocked()
        assert (granted, budget.waiting) == ([], 2)
        budget.release(60)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(granted) == ["big", "small"]  # both let in at once (in order)
        nursery.start_soon(reserve, "next", 50)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(reserve, "one", 1)
        await trio.testing.wait_all_tasks_blocked()
        assert budget.waiting == 2  # "one" fits beside the 60, but waits behind "next"
        budget.release(50)  # "big" is done
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(granted) == ["big", "next", "one", "small"]
    assert (budget.in_use, budget.peak) == (61, 61)


async def test_a_piece_larger_than_the_budget_runs_alone() -> None:
    budget = ReadBudget(100)
    await budget.reserve(1)
    done = trio.Event()

    async def huge() -> None:
        await budget.reserve(500)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(huge)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
        budget.release(1)
        await done.wait()
    assert budget.in_use == 500
    budget.release(500)
    assert budget.in_use == 0


async def test_a_cancelled_waiter_lets_those_behind_it_in() -> None:
    budget = ReadBudget(100)
    await budget.reserve(90)
    got_small = trio.Event()

    async def small() -> None:
        await budget.reserve(10)
        got_small.set()

    async with trio.open_nursery() as nursery:
        big = trio.CancelScope()

        async def reserve_big() -> None:
            with big:
                await budget.reserve(50)

        nursery.start_soon(reserve_big)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(small)
        await trio.testing.wait_all_tasks_blocked()
        assert not got_small.is_set()  # behind the big one
        big.cancel()
        await got_small.wait()
    assert (budget.in_use, budget.waiting) == (100, 0)


async def test_a_reservation_cancelled_as_it_is_made_takes_nothing() -> None:
    budget = ReadBudget(100)
    with trio.CancelScope() as scope:
        scope.cancel()
        await budget.reserve(10)  # room for it: still cancelled, and nothing taken
    assert scope.cancelled_caught
    assert budget.in_use == 0


async def test_new_reads_wait_while_the_memory_alarm_is_set(
    autojump_clock: trio.testing.MockClock,
) -> None:
    alarms = ResourceAlarms()
    budget = ReadBudget(MIB, alarms, patience=5.0)
    await budget.admit()  # no alarm: at once
    alarms.set(MEMORY, "memory use 600 MiB, high watermark 512 MiB")
    alarms.set("disk", "free disk space 1 MiB")
    started = trio.current_time()
    with pytest.raises(LowOnMemory) as refused:
        await budget.admit()
    assert trio.current_time() - started == pytest.approx(5.0)
    assert "low on memory (memory use 600 MiB, high watermark 512 MiB)" in refused.value.message
    assert refused.value.retry_after == 1

    async def clear_later() -> None:
        await trio.sleep(2)
        alarms.clear(MEMORY, "memory use 100 MiB")  # the disk alarm does not hold reads

    async with trio.open_nursery() as nursery:
        nursery.start_soon(clear_later)
        started = trio.current_time()
        await budget.admit()
        assert trio.current_time() - started == pytest.approx(2.0)


async def test_a_body_holds_one_piece_at_a_time() -> None:
    budget = ReadBudget(10 * MIB)
    seen: list[int] = []

    def piece(size: int) -> Piece:
        async def build() -> bytes:
            seen.append(budget.in_use)  # reserved before it is built
            return b"x" * size

        return Piece(size, build)

    body = ReadBody(budget, [piece(3), piece(SLICE_BYTES + 5), piece(0), piece(7)], None)
    slices = [len(chunk) async for chunk in body]
    assert slices == [3, SLICE_BYTES, 5, 7]
    assert seen == [3, SLICE_BYTES + 5, 0, 7]
    assert body.length is None  # not known beforehand: several pieces
    assert budget.in_use == 0  # the last piece went back at the end
    assert budget.peak == SLICE_BYTES + 5


async def test_a_piece_that_outgrew_its_reservation_is_built_again_under_its_size() -> None:
    """When the budget has no room for the difference now: here a read waits for room."""
    budget = ReadBudget(4 * MIB)
    builds: list[int] = []
    going_on = trio.Event()

    async def build() -> bytes:
        builds.append(budget.in_use)
        await going_on.wait()
        return b"y" * (3 * MIB)

    async def other_read() -> None:
        await budget.reserve(4 * MIB)
        budget.release(4 * MIB)

    body = ReadBody(budget, [Piece(MIB, build)], None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(body.start)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(other_read)  # waits behind the piece being built
        await trio.testing.wait_all_tasks_blocked()
        going_on.set()
    assert builds == [MIB, 3 * MIB]  # dropped, waited behind the other read, built again
    assert body.length == 3 * MIB  # one piece: its length is known once built
    assert (budget.in_use, budget.peak) == (3 * MIB, 4 * MIB)
    assert len(await body.read_all()) == 3 * MIB
    assert budget.in_use == 0


async def test_a_piece_that_outgrew_its_reservation_keeps_what_there_is_room_for() -> None:
    budget = ReadBudget(100 * MIB)

    async def build() -> bytes:
        return b"y" * (3 * MIB)

    body = ReadBody(budget, [Piece(MIB, build)], None)
    await body.start()
    assert budget.in_use == 3 * MIB  # built once
    body.close()
    assert budget.in_use == 0


async def test_a_closed_body_gives_back_what_it_holds() -> None:
    budget = ReadBudget(100)

    async def build() -> bytes:
        return b"z" * 40

    body = ReadBody(budget, [Piece(50, build), Piece(50, build)], 80)
    await body.start()
    assert budget.in_use == 40  # the reservation shrinks to the piece built
    await body.__anext__()
    body.close()
    assert budget.in_use == 0
    with pytest.raises(StopAsyncIteration):
        await body.__anext__()


def test_the_budget_is_a_tenth_of_the_watermark() -> None:
    assert budget_for(512 * MIB) == int(51.2 * MIB)
    assert budget_for(0) == 8 * MIB  # at least a few pieces
