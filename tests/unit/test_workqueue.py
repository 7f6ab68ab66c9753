"""The work queue's guarantees: one waiting entry per key, one worker per key, nothing dropped."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.runtime.workqueue import WorkQueue

pytestmark = pytest.mark.unit


def run(coro):
    return asyncio.run(coro)


def test_a_key_added_twice_waits_once():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")
        queue.add("a")
        queue.add("b")
        assert len(queue) == 2
        assert [await queue.get(), await queue.get()] == ["a", "b"]

    run(scenario())


def test_a_key_added_while_processed_comes_back_after_done_not_before():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")
        key = await queue.get()
        queue.add("a")  # a new event while a worker holds "a"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(queue.get(), 0.05)  # not handed to a second worker
        queue.done(key)
        assert await asyncio.wait_for(queue.get(), 1) == "a"

    run(scenario())


def test_delayed_adds_keep_the_earliest_time():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        loop = asyncio.get_running_loop()
        began = loop.time()
        queue.add_after("a", 5)
        queue.add_after("a", 0.05)  # earlier: replaces the 5 s one
        queue.add_after("a", 3)  # later: ignored
        assert await asyncio.wait_for(queue.get(), 1) == "a"
        assert loop.time() - began < 1
        queue.done("a")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(queue.get(), 0.2)  # the dropped timers do not fire again

    run(scenario())


def test_forget_cancels_a_pending_delayed_add():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        queue.add_after("a", 0.05)
        queue.forget("a")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(queue.get(), 0.2)

    run(scenario())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3)), min_size=1, max_size=40))
def test_concurrent_workers_never_hold_one_key_twice_and_see_every_last_add(adds):
    """Workers race over random adds; a key is never processed twice at once, and every key
    added is processed at least once after its last add."""

    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
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
