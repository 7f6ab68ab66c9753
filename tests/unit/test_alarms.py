"""Silence alarms: a job whose attempts keep beating is not reconciled when its old deadline
passes; a job whose verdict changed is woken, at the deadline or at once."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vigil.controllers.alarms import EARLY_SECONDS, SilenceAlarms, ring_or_rearm

pytestmark = pytest.mark.unit

DEADLINE = 5.0
states = st.dictionaries(st.sampled_from(["p1", "p2", "p3"]), st.sampled_from(["Healthy", "Uncertain", "Lost"]))


@given(decided=states, current=states, deadline=st.none() | st.floats(0, 100), now=st.floats(0, 100))
def test_an_alarm_wakes_exactly_when_a_verdict_changed_or_its_deadline_is_reached(decided, current, deadline, now):
    when = ring_or_rearm(decided, current, deadline, now)
    changed = decided != current
    reached = deadline is None or deadline <= now + EARLY_SECONDS
    if changed or reached:
        assert when is None, "woken"
    else:
        assert when == deadline, "set again for the instant beats moved the deadline to"


class Job:
    """What the controller's `look` reports for one job: its pods' states and next deadline."""

    def __init__(self, state: str = "Healthy", in_seconds: float | None = 0.05):
        self.states = {"p1": state}
        self.deadline = None if in_seconds is None else time.monotonic() + in_seconds

    def look(self, key: str) -> tuple[dict[str, str], float | None]:
        return dict(self.states), self.deadline


def alarms_for(job: Job) -> tuple[SilenceAlarms[str], list[str]]:
    woken: list[str] = []
    return SilenceAlarms(job.look, woken.append, time.monotonic), woken


async def until(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"not within {DEADLINE}s: {what}"
        await asyncio.sleep(0.01)


def test_beats_that_move_the_deadline_re_arm_the_alarm_without_a_wake():
    async def scenario():
        job = Job(in_seconds=0.05)
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})

        async def beat() -> None:  # every 20 ms, each beat moves the deadline 50 ms on
            while True:
                job.deadline = time.monotonic() + 0.05
                await asyncio.sleep(0.02)

        beating = asyncio.create_task(beat())
        await until(lambda: alarms.rearmed >= 3, "the alarm rang three times")
        beating.cancel()
        assert woken == [], "a job that keeps beating is not reconciled"
        assert len(alarms) == 1, "and its alarm is still set"
        await until(lambda: woken == ["j"], "the silence reached the deadline")  # no beat any more
        assert len(alarms) == 0

    asyncio.run(scenario())


def test_a_verdict_that_changed_wakes_the_job_when_the_alarm_rings():
    async def scenario():
        job = Job(in_seconds=0.05)
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})
        job.states["p1"], job.deadline = "Uncertain", time.monotonic() + 60  # silent: Lost next
        await until(lambda: woken == ["j"], "woken for the Uncertain verdict")
        assert alarms.rearmed == 0

    asyncio.run(scenario())


def test_a_verdict_that_changed_while_the_decision_was_written_wakes_the_job_at_once():
    async def scenario():
        job = Job(state="Uncertain", in_seconds=60)
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})  # decided on Healthy; Uncertain by the time it is armed
        assert woken == ["j"]
        assert len(alarms) == 0

    asyncio.run(scenario())


def test_no_deadline_sets_no_alarm_and_a_cancelled_alarm_never_rings():
    async def scenario():
        job = Job(in_seconds=None)  # a pod not running yet, or heartbeats not required
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})
        assert len(alarms) == 0 and woken == []
        job.deadline = time.monotonic() + 0.02
        alarms.arm("j", {"p1": "Healthy"})
        alarms.cancel("j")  # the job is gone
        await asyncio.sleep(0.1)  # longer than the deadline: nothing may ring
        assert woken == [] and len(alarms) == 0

    asyncio.run(scenario())


def test_arming_again_replaces_the_alarm():
    async def scenario():
        job = Job(in_seconds=0.03)
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})
        job.deadline = time.monotonic() + 60
        alarms.arm("j", {"p1": "Healthy"})  # a later decision, after a beat
        await asyncio.sleep(0.1)
        assert woken == [] and alarms.rearmed == 0, "the first alarm was replaced, not kept"
        assert len(alarms) == 1

    asyncio.run(scenario())
