"""The long-lived heap: what survives a full collection is frozen, so the next full collections
walk only what is newer; every hour it is all thawed and collected once."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from tests.support.clock import FakeClock
from vigil.runtime.heap import LongLivedHeap

pytestmark = pytest.mark.unit


class FakeCollector:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.calls: list[str] = []

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        for callback in list(self.callbacks):  # as the interpreter does, around the collection
            callback("start", {"generation": generation})
            callback("stop", {"generation": generation, "collected": 7, "uncollectable": 0})
        return 7


def test_survivors_of_each_full_collection_are_frozen_and_the_heap_is_thawed_hourly():
    clock, collector = FakeClock(), FakeCollector()
    heap = LongLivedHeap(clock, collector, thaw_seconds=3600, elapsed=lambda: 0.0)
    asyncio.run(heap.start())
    assert collector.calls == ["freeze"]  # what the start built
    for generation in (0, 1):  # young collections leave the frozen heap alone
        for callback in collector.callbacks:
            callback("stop", {"generation": generation})
    assert collector.calls == ["freeze"]
    for callback in collector.callbacks:  # the interpreter's own full collection
        callback("stop", {"generation": 2})
    assert collector.calls == ["freeze", "freeze"]
    clock.tick(3599)
    assert collector.calls == ["freeze", "freeze"]
    clock.tick(1)  # an hour on: all thawed, collected once, frozen again; and an hour after that
    assert collector.calls[2:] == ["unfreeze", "collect(2)", "freeze"]
    clock.tick(3600)
    assert collector.calls[5:] == ["unfreeze", "collect(2)", "freeze"]
    asyncio.run(heap.stop())
    assert collector.calls[-1] == "unfreeze" and collector.callbacks == [] and clock.pending() == 0


def test_with_the_real_collector_a_full_collection_walks_only_what_is_newer_than_the_last():
    clock = FakeClock()
    heap = LongLivedHeap(clock, thaw_seconds=3600)
    asyncio.run(heap.start())
    try:
        kept = [{"job": n} for n in range(10_000)]  # a cache: lives on
        gc.collect()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)  # frozen by the collection's end
        newer = [[n] for n in range(1000)]
        assert len(gc.get_objects(generation=2)) < len(kept)  # the next full one walks the new alone
        clock.tick(3600)  # the hourly thaw collects everything once, then freezes it again
        assert gc.get_freeze_count() >= len(kept) + len(newer)
    finally:
        asyncio.run(heap.stop())
    assert gc.get_freeze_count() == 0  # stopped: the collector as it was
