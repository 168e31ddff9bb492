"""FairSlots: a bounded number of holders, shared between owners by who holds fewest.

The ordering tests run on one event loop, so who queues when is exact (no sleeps, no threads);
the thread tests check the bound and the timeouts of the blocking API.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor

import pytest

from ragservice.limits.fair_slots import FairSlots


async def queued(
    slots: FairSlots, owner: Hashable, log: list[str], label: str
) -> asyncio.Task[None]:
    """A task waiting for a slot for `owner` (already in the queue when this returns); it notes
    `label` in `log` once granted and holds the slot until cancelled."""

    async def wait() -> None:
        await slots.acquire_async(owner)
        log.append(label)

    task = asyncio.create_task(wait())
    before = slots.waiting(owner)
    while slots.waiting(owner) == before and not task.done():
        await asyncio.sleep(0)
    return task


async def settle() -> None:
    for _ in range(5):  # grants are delivered with call_soon: let them run
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_a_freed_slot_goes_to_the_late_owner_not_to_the_flood_ahead_of_it() -> None:
    slots = FairSlots(2)
    granted: list[str] = []
    await slots.acquire_async("a")
    await slots.acquire_async("a")
    flood = [await queued(slots, "a", granted, f"a{i}") for i in range(5)]
    late = await queued(slots, "b", granted, "b")

    slots.release("a")
    await settle()
    assert granted == ["b"]  # ahead of the five waiting before it: b held nothing
    assert (slots.held("a"), slots.held("b"), slots.waiting("a")) == (1, 1, 5)

    slots.release("a")
    await settle()
    assert granted == ["b", "a0"]  # then a's own waiters, in their order
    assert late.done() and not flood[1].done()
    for task in flood:
        task.cancel()


@pytest.mark.anyio
async def test_with_one_owner_for_all_it_is_first_come_first_served_and_starves_the_late() -> None:
    """What the service did before fair shares (one FIFO semaphore): a request that arrives
    behind another tenant's flood waits for all of it, and with a deadline gets a 504."""
    slots = FairSlots(2)
    granted: list[str] = []
    await slots.acquire_async(None)
    await slots.acquire_async(None)
    flood = [await queued(slots, None, granted, f"a{i}") for i in range(5)]
    late = await queued(slots, None, granted, "b")
    for _ in range(4):
        slots.release(None)
        await settle()
    assert granted == ["a0", "a1", "a2", "a3"]  # four slots freed; "b" still waits
    assert not late.done()
    for task in [*flood, late]:
        task.cancel()


@pytest.mark.anyio
async def test_owners_holding_as_many_take_turns_round_robin() -> None:
    slots = FairSlots(1)
    granted: list[str] = []
    await slots.acquire_async("x")
    tasks = [await queued(slots, o, granted, f"{o}{i}") for o in "abc" for i in (1, 2)]
    holders = ["x", "a", "b", "c", "a", "b"]  # who holds the slot at each release
    for holder in holders:
        slots.release(holder)
        await settle()
    assert granted == ["a1", "b1", "c1", "a2", "b2", "c2"]
    assert all(task.done() for task in tasks)


@pytest.mark.anyio
async def test_per_owner_keeps_a_slot_for_others_even_when_free() -> None:
    slots = FairSlots(3, per_owner=2)
    granted: list[str] = []
    await slots.acquire_async("a")
    await slots.acquire_async("a")
    third = await queued(slots, "a", granted, "a3")
    assert (slots.in_use, granted) == (2, [])  # a free slot, but not for a
    await queued(slots, "b", granted, "b")
    assert granted == ["b"]  # at once
    slots.release("a")
    await settle()
    assert granted == ["b", "a3"] and third.done()


@pytest.mark.anyio
async def test_a_waiter_that_times_out_leaves_the_queue_holding_nothing() -> None:
    slots = FairSlots(1)
    await slots.acquire_async("a")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await slots.acquire_async("b")
    assert (slots.waiting(), slots.held("b")) == (0, 0)
    slots.release("a")
    assert slots.in_use == 0


@pytest.mark.anyio
async def test_a_waiter_cancelled_just_after_its_grant_hands_the_slot_on() -> None:
    slots = FairSlots(1)
    granted: list[str] = []
    await slots.acquire_async("x")
    first = await queued(slots, "a", granted, "a")
    second = await queued(slots, "b", granted, "b")
    slots.release("x")  # grants "a", whose task has not run yet
    first.cancel()
    await settle()
    assert granted == ["b"] and second.done() and first.cancelled()
    assert (slots.held("a"), slots.held("b"), slots.in_use) == (0, 1, 1)


def test_threads_never_exceed_the_capacity_and_all_get_through() -> None:
    slots = FairSlots(3)
    lock = threading.Lock()
    now, peak = 0, 0
    full = threading.Barrier(3, timeout=10)  # the first three meet inside: the bound is filled

    def work(i: int) -> int:
        nonlocal now, peak
        with slots.hold(i % 4):
            with lock:
                now += 1
                peak = max(peak, now)
            if i < 3:
                full.wait()
            with lock:
                now -= 1
        return i

    with ThreadPoolExecutor(max_workers=12) as pool:
        done = list(pool.map(work, range(40)))
    assert done == list(range(40))
    assert peak == 3 and slots.in_use == 0


def test_a_thread_that_times_out_gets_false_and_holds_nothing() -> None:
    slots = FairSlots(1)
    assert slots.acquire("a", timeout=0)
    assert not slots.acquire("b", timeout=0.01)
    assert (slots.waiting(), slots.held("b"), slots.in_use) == (0, 0, 1)
    slots.release("a")
    assert slots.acquire("b", timeout=0)


def test_releasing_a_slot_not_held_is_an_error() -> None:
    slots = FairSlots(2)
    slots.acquire("a")
    with pytest.raises(ValueError, match="holds no slot"):
        slots.release("b")
    assert slots.in_use == 1
