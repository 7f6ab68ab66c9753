"""The work queue's guarantees: one waiting entry per key, one worker per key, nothing dropped."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clock import FakeClock, settle
from vigil.runtime.workqueue import WorkQueue

pytestmark = pytest.mark.unit


def run(coro):
    return asyncio.run(coro)


def test_a_key_added_twice_waits_once():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue(FakeClock())
        queue.add("a")
        queue.add("a")
        queue.add("b")
        assert len(queue) == 2
        assert [await queue.get(), await queue.get()] == ["a", "b"]

    run(scenario())


def test_a_key_added_while_processed_comes_back_after_done_not_before():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue(FakeClock())
        queue.add("a")
        key = await queue.get()
        queue.add("a")  # a new event while a worker holds "a"
        second = asyncio.ensure_future(queue.get())
        await settle()
        assert not second.done()  # not handed to a second worker
        queue.done(key)
        await settle()
        assert second.result() == "a"

    run(scenario())


def test_delayed_adds_keep_the_earliest_time():
    async def scenario():
        clock = FakeClock()
        queue: WorkQueue[str] = WorkQueue(clock)
        queue.add_after("a", 5)
        queue.add_after("a", 0.05)  # earlier: replaces the 5 s one
        queue.add_after("a", 3)  # later: ignored
        taken = asyncio.ensure_future(queue.get())
        await clock.advance(0.04)
        assert not taken.done()
        await clock.advance(0.01)
        assert taken.result() == "a"
        queue.done("a")
        again = asyncio.ensure_future(queue.get())
        await clock.advance(10)
        assert not again.done()  # the dropped timers do not fire again
        again.cancel()

    run(scenario())


def test_forget_cancels_a_pending_delayed_add():
    async def scenario():
        clock = FakeClock()
        queue: WorkQueue[str] = WorkQueue(clock)
        queue.add_after("a", 0.05)
        queue.forget("a")
        taken = asyncio.ensure_future(queue.get())
        await clock.advance(1)
        assert not taken.done() and clock.pending() == 0
        taken.cancel()

    run(scenario())


def test_the_wait_reported_is_the_clocks():
    async def scenario():
        clock, waits = FakeClock(), []
        queue: WorkQueue[str] = WorkQueue(clock, on_wait=waits.append)
        queue.add("a")
        clock.tick(2.5)
        await queue.get()
        assert waits == [2.5]

    run(scenario())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3)), min_size=1, max_size=40))
def test_concurrent_workers_never_hold_one_key_twice_and_see_every_last_add(adds):
    """Workers race over random adds; a key is never processed twice at once, and every key
    added is processed at least once after its last add."""

    async def scenario():
        queue: WorkQueue[str] = WorkQueue(FakeClock())
        holding: set[str] = set()
        last_added: dict[str, int] = {}
        processed_after: dict[str, int] = {}
        tick = 0

        async def worker():
            nonlocal tick
            while True:
                key = await queue.get()
                assert key not in holding, f"{key} handed to two workers"
                holding.add(key)
                tick += 1
                processed_after[key] = tick
                await asyncio.sleep(0)
                holding.discard(key)
                queue.done(key)

        workers = [asyncio.create_task(worker()) for _ in range(3)]
        for key, pause in adds:
            tick += 1
            last_added[key] = tick
            queue.add(key)
            for _ in range(pause):
                await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for key, added in last_added.items():
            assert processed_after.get(key, -1) > added, f"{key}'s last add was never processed"

    run(scenario())
