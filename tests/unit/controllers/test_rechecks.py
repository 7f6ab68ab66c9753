"""StartingRechecks: when a job left in Starting is read directly, and that its timer goes with it."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import FakeClock
from vigil.controllers.jobs.rechecks import StartingRechecks


def test_a_read_is_due_one_period_after_the_first_look_and_then_one_period_after_each_read():
    clock = FakeClock()
    rechecks: StartingRechecks[str] = StartingRechecks(lambda key: None, clock, period=30)
    assert not rechecks.due("j"), "the first look starts the count"
    clock.now += 29.9
    assert not rechecks.due("j")
    clock.now += 0.1
    assert rechecks.due("j")
    clock.now += 10
    assert not rechecks.due("j"), "the read just made starts the count again"
    clock.now += 20
    assert rechecks.due("j")


def test_a_job_that_leaves_starting_starts_its_count_afresh_if_it_comes_back():
    clock = FakeClock()
    rechecks: StartingRechecks[str] = StartingRechecks(lambda key: None, clock, period=30)
    rechecks.due("j")
    clock.now += 40
    rechecks.clear("j")  # Running now
    assert len(rechecks) == 0, "nothing remembered of a job that left Starting"
    assert not rechecks.due("j"), "Starting again (a new attempt): counted from now"


def woken(armed: list[str], cleared: tuple[str, ...] = (), shutdown: bool = False) -> list[str]:
    """The keys woken over a minute after arming `armed` in order (30 s period), then clearing
    `cleared` and, if asked, shutting down."""

    async def scenario() -> list[str]:
        clock, wakes = FakeClock(), []
        rechecks: StartingRechecks[str] = StartingRechecks(wakes.append, clock, period=30)
        for key in armed:
            rechecks.arm(key)
        for key in cleared:
            rechecks.clear(key)
        if shutdown:
            rechecks.shutdown()
            assert len(rechecks) == 0
        await clock.advance(29.9)
        assert wakes == [], "not before its period"
        await clock.advance(30)
        return wakes

    return asyncio.run(scenario())


def test_the_timer_wakes_a_job_still_starting_once_per_arming():
    assert woken(["j", "j"]) == ["j"], "a second look before the ring: still one timer"


def test_a_job_that_left_starting_is_not_woken_by_its_old_timer():
    assert woken(["started", "stuck"], cleared=("started",)) == ["stuck"]


def test_shutdown_cancels_every_timer():
    assert woken(["a", "b"], shutdown=True) == []


@pytest.mark.parametrize("period", [0.0, 0.01])
def test_a_short_period_still_wakes_after_the_arming_look_returns(period: float):
    async def scenario() -> list[str]:
        clock, wakes = FakeClock(), []
        rechecks: StartingRechecks[str] = StartingRechecks(wakes.append, clock, period=period)
        rechecks.arm("j")
        assert wakes == [], "never from inside arm(): the look that armed it is still running"
        await clock.advance(1)
        return wakes

    assert asyncio.run(scenario()) == ["j"]
