"""The work queue's guarantees: one waiting entry per key, one worker per key, nothing dropped."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.clock import FakeClock, settle
from vigil.runtime.workqueue import WorkQueue, namespace_of

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


def namespaced(namespace: str, name: str) -> tuple[str, str]:
    return (namespace, name)


def test_a_namespaces_one_key_waits_one_round_behind_another_namespaces_ten_thousand():
    async def scenario():
        queue: WorkQueue[tuple[str, str]] = WorkQueue(FakeClock(), tenant=namespace_of)
        for i in range(10_000):
            queue.add(("flood", f"job-{i}"))
        first = await queue.get()
        queue.add(("quiet", "job"))
        assert first == ("flood", "job-0")
        assert [await queue.get(), await queue.get()] == [("flood", "job-1"), ("quiet", "job")]

    run(scenario())


def test_without_a_tenant_the_queue_is_fifo():
    async def scenario():
        queue: WorkQueue[tuple[str, str]] = WorkQueue(FakeClock())
        for key in [("a", "1"), ("a", "2"), ("b", "1")]:
            queue.add(key)
        assert [await queue.get() for _ in range(3)] == [("a", "1"), ("a", "2"), ("b", "1")]

    run(scenario())


def test_a_worker_cancelled_after_it_was_woken_passes_the_key_on():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue(FakeClock())
        first, second = asyncio.ensure_future(queue.get()), asyncio.ensure_future(queue.get())
        await settle()
        queue.add("a")  # wakes the first worker
        first.cancel()  # which is stopped before it runs
        await settle()
        assert second.result() == "a"

    run(scenario())


# Each step: add (key, or None: take a key), with its namespace drawn from three.
queue_steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(["flood"] * 3 + ["a", "b"]), st.integers(0, 40)),
        st.tuples(st.just("later"), st.sampled_from(["flood", "a", "b"]), st.integers(0, 5)),
        st.tuples(st.just("take"), st.none(), st.none()),
        st.tuples(st.just("take"), st.none(), st.none()),
        st.tuples(st.just("done"), st.none(), st.integers(0, 3)),
        st.tuples(st.just("tick"), st.none(), st.none()),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(queue_steps)
@example([("add", "flood", 1), ("add", "flood", 2), ("add", "a", 1), ("take", None, None), ("take", None, None)])
def test_tenants_keep_the_guarantees_and_wait_at_most_one_round(script):
    """Adds (now and delayed), takes and dones interleaved across namespaces: a key is held by
    one worker at a time, waits at most once, comes back after done when added while held, every
    last add is processed; and a key of a namespace with nothing else ready waits for at most
    one key of each other namespace."""

    async def scenario():
        clock = FakeClock()
        holding: list[tuple[str, int]] = []
        ready: set[tuple[str, int]] = set()  # what the model says waits
        dirty: set[tuple[str, int]] = set()
        ahead: dict[tuple[str, int], dict[str, int]] = {}
        owed: set[tuple[str, int]] = set()  # added, not processed since

        def added(key):
            owed.add(key)
            if key in holding:
                dirty.add(key)
            elif key not in ready:
                if key[0] not in {k[0] for k in ready}:
                    ahead[key] = {}
                ready.add(key)

        queue = _Noted(clock, added)
        for op, namespace, number in script:
            if op == "add":
                queue.add((namespace, number))
            elif op == "later":
                queue.add_after((namespace, number), number * 0.1)
            elif op == "tick":
                clock.tick(0.2)
            elif op == "take" and ready:
                key = await queue.get()
                assert key in ready and key not in holding
                ready.discard(key)
                ahead.pop(key, None)
                owed.discard(key)
                for waiting, served in ahead.items():
                    served[key[0]] = served.get(key[0], 0) + 1
                    assert served[key[0]] <= 1, f"{key[0]} served twice ahead of {waiting}"
                holding.append(key)
            elif op == "done" and holding:
                key = holding.pop(number % len(holding))
                queue.done(key)
                if key in dirty:
                    dirty.discard(key)
                    added(key)
            assert len(queue) == len(ready) + len(dirty)
        while holding:
            key = holding.pop()
            queue.done(key)
            if key in dirty:
                dirty.discard(key)
                added(key)
        await clock.advance(10)  # every delayed add fires
        while ready:
            key = await queue.get()
            ready.discard(key)
            owed.discard(key)
            queue.done(key)
        assert not owed, f"added but never processed: {sorted(owed)}"

    run(scenario())


class _Noted(WorkQueue[tuple[str, int]]):
    """Tells the model of every add, the delayed ones as they fire too."""

    def __init__(self, clock, note):
        super().__init__(clock, tenant=namespace_of)
        self.note = note

    def add(self, key):
        self.note(key)
        super().add(key)
