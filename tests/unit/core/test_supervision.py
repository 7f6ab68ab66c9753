"""The supervisor's decisions: a restart's delay grows with the crashes of the last window, and
the workers are unhealthy when one stays dead or they keep dying."""

from __future__ import annotations

import pytest

from vigil.core.supervision import (
    CRASH_WINDOW_SECONDS,
    CRASHES_TOLERATED,
    DOWN_GRACE_SECONDS,
    RESTART_DELAYS,
    Crashes,
)

pytestmark = pytest.mark.unit


def test_the_restart_delay_grows_with_recent_crashes_and_is_capped():
    crashes = Crashes()
    delays = [crashes.crashed(1000.0 + i, 0.0) for i in range(12)]
    assert delays[0] == RESTART_DELAYS[0]
    assert delays == sorted(delays) and delays[-1] == RESTART_DELAYS[1]


def test_old_crashes_are_forgotten():
    crashes = Crashes()
    for i in range(CRASHES_TOLERATED + 1):
        crashes.crashed(1000.0 + i, 0.0)
    assert crashes.verdict(1000.0 + CRASHES_TOLERATED, []) is not None
    later = 1000.0 + CRASHES_TOLERATED + CRASH_WINDOW_SECONDS
    assert crashes.verdict(later, []) is None
    assert crashes.crashed(later, 0.0) == RESTART_DELAYS[0], "a crash after a quiet window starts the backoff over"


def test_a_few_crashes_are_tolerated():
    crashes = Crashes()
    for i in range(CRASHES_TOLERATED):
        crashes.crashed(1000.0 + i, 0.5)
    assert crashes.verdict(1010.0, []) is None


def test_a_worker_down_longer_than_any_restart_takes_is_dead():
    crashes = Crashes()
    crashes.crashed(1000.0, 0.0)
    bound = RESTART_DELAYS[1] + DOWN_GRACE_SECONDS
    assert crashes.verdict(1000.0 + bound, [1000.0]) is None
    why = crashes.verdict(1000.0 + bound + 1, [1000.0])
    assert why is not None and "dead" in why
