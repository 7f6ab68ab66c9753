"""Waiting in the suites that run on a cluster, and the one setting that widens every wait.

Every upper bound of the integration and end-to-end tests (how long to wait for something, how
soon something must have happened) is written as what an idle machine needs, with its margin,
and goes through `deadline()`: multiplied by $VIGIL_TEST_SLACK (default 1, the bounds as
written). A loaded machine sets, say, VIGIL_TEST_SLACK=2, and every bound doubles at once, rather
than one at a time after each CI failure. `wait_until` and the other waits here apply it
themselves; a test that compares a measured time with a bound writes `<= deadline(6)`.

What is not scaled: lower bounds (load cannot make a thing happen sooner), and windows in which
nothing may happen (`holds`): their length is the claim, not a guess at a machine's speed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

SLACK_VARIABLE = "VIGIL_TEST_SLACK"


def _slack() -> float:
    text = os.environ.get(SLACK_VARIABLE, "1")
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{SLACK_VARIABLE}={text!r}: a positive multiplier of every upper bound, e.g. 1.5")
    return value


SLACK = _slack()


def deadline(seconds: float) -> float:
    """`seconds`, an upper bound as written for an idle machine, times $VIGIL_TEST_SLACK."""
    return seconds * SLACK


def _waited(timeout: float) -> str:
    return f"{deadline(timeout):g}s" + (f" ({timeout:g}s x {SLACK_VARIABLE}={SLACK:g})" if SLACK != 1 else "")


def poll(condition: Callable[[], object], timeout: float, interval: float = 0.2) -> object:
    """Calls condition() until it returns something truthy, for at most deadline(timeout)
    seconds; returns its last value (falsy if the time ran out)."""
    end = time.monotonic() + deadline(timeout)
    while True:
        last = condition()
        if last or time.monotonic() >= end:
            return last
        time.sleep(min(interval, max(0.0, end - time.monotonic())))


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """Polls condition() until it returns something truthy, which is returned; fails, naming
    `what`, after deadline(timeout) seconds."""
    end = time.monotonic() + deadline(timeout)
    last = None
    while time.monotonic() < end:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {_waited(timeout)} waiting for {what} (last: {last!r})")


def holds(check: Callable[[], None], seconds: float, interval: float = 0.5) -> None:
    """Runs check() (which asserts) over and over for `seconds`: for the claims that something
    does not happen for a while, where waiting the whole while is the point, not a guess."""
    end = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() >= end:
            return
        time.sleep(min(interval, max(0.0, end - time.monotonic())))


# --- the same, in an event loop -----------------------------------------------------------------


async def until(
    condition: Callable[[], object],
    timeout: float,
    what: str,
    clock: Callable[[], float] = time.monotonic,
    interval: float = 0.02,
) -> float:
    """Polls condition() every `interval` without blocking the loop; returns `clock()` when it
    first held; fails after deadline(timeout) seconds."""
    end = clock() + deadline(timeout)
    while clock() < end:
        if condition():
            return clock()
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {_waited(timeout)} waiting for {what}")


async def holds_async(
    condition: Callable[[], object],
    seconds: float,
    what: str,
    clock: Callable[[], float] = time.monotonic,
    interval: float = 0.02,
) -> None:
    """Checks condition() every `interval` for a whole window of `seconds` (not scaled: the
    window is the claim)."""
    end = clock() + seconds
    while clock() < end:
        assert condition(), what
        await asyncio.sleep(interval)
