"""Keyed timers: one per key, replaced or kept-earlier as asked, each firing once at its time."""

from __future__ import annotations

import pytest

from tests.support.clock import FakeClock
from vigil.runtime.timers import Timers

pytestmark = pytest.mark.unit


def timers() -> tuple[FakeClock, Timers[str], list[tuple[str, float]]]:
    clock, fired = FakeClock(), []
    return clock, Timers(clock, lambda key: fired.append((key, clock.now))), fired


def test_a_timer_fires_once_at_its_time():
    clock, keyed, fired = timers()
    keyed.set_after("a", 5)
    clock.tick(4.9)
    assert fired == [] and "a" in keyed and keyed.due("a") == 1005.0
    clock.tick(100)
    assert fired == [("a", 1005.0)] and "a" not in keyed and len(keyed) == 0


def test_setting_a_key_again_replaces_its_timer_unless_told_to_keep_the_earlier():
    clock, keyed, fired = timers()
    keyed.set_after("a", 5)
    keyed.set_after("a", 8)  # replaces: later
    keyed.set_after("b", 2)
    keyed.set_after("b", 6, keep_earlier=True)  # kept: 2 s is sooner
    keyed.set_after("c", 6)
    keyed.set_after("c", 1, keep_earlier=True)  # sooner: taken
    clock.tick(10)
    assert fired == [("c", 1001.0), ("b", 1002.0), ("a", 1008.0)], "each key fired once, at its one time"


def test_a_cancelled_timer_never_fires_and_shutdown_cancels_all():
    clock, keyed, fired = timers()
    keyed.set_after("a", 1)
    keyed.set_after("b", 1)
    keyed.cancel("a")
    keyed.cancel("unknown")  # no timer: nothing to do
    clock.tick(2)
    assert fired == [("b", 1001.0)]
    keyed.set_after("c", 1)
    keyed.shutdown()
    clock.tick(2)
    assert fired == [("b", 1001.0)] and len(keyed) == 0 and clock.pending() == 0


def test_a_timer_set_from_its_own_firing_is_a_new_one():
    clock, fired = FakeClock(), []

    def again(key: str) -> None:
        fired.append(clock.now)
        if len(fired) < 3:
            keyed.set_after(key, 1)

    keyed: Timers[str] = Timers(clock, again)
    keyed.set_after("a", 1)
    clock.tick(10)
    assert fired == [1001.0, 1002.0, 1003.0]
