"""Silence alarms: a job whose attempts keep beating is not reconciled when its old deadline
passes; a job whose verdict changed is woken, at the deadline or at once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.clock import FakeClock
from vigil.controllers.jobs.alarms import SilenceAlarms
from vigil.core.liveness import EARLY_SECONDS, ring_or_rearm

pytestmark = pytest.mark.unit

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

    def __init__(self, clock: FakeClock, state: str = "Healthy", in_seconds: float | None = 5.0):
        self.clock = clock
        self.states = {"p1": state}
        self.deadline = None if in_seconds is None else clock.now + in_seconds

    def look(self, key: str) -> tuple[dict[str, str], float | None]:
        return dict(self.states), self.deadline


def alarms_for(job: Job) -> tuple[SilenceAlarms[str], list[str]]:
    woken: list[str] = []
    return SilenceAlarms(job.look, woken.append, job.clock), woken


def test_a_job_that_keeps_beating_is_never_woken_and_its_alarm_stays_set():
    async def scenario():
        clock = FakeClock()
        job = Job(clock, in_seconds=5)
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})
        for _ in range(10):
            job.deadline = clock.now + 5  # a beat
            await clock.advance(4)
        assert woken == [] and len(alarms) == 1, "a job that keeps beating is not reconciled"
        assert alarms.rearmed == 9, "each ring found the deadline moved by a beat and set it again"
        await clock.advance(5)  # no beat any more: the silence reaches the deadline
        assert woken == ["j"] and len(alarms) == 0

    asyncio.run(scenario())


def test_a_verdict_that_changed_wakes_the_job_when_the_alarm_rings():
    async def scenario():
        clock = FakeClock()
        job = Job(clock, in_seconds=5)
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})
        job.states["p1"], job.deadline = "Uncertain", clock.now + 60  # silent: Lost next
        await clock.advance(4.9)
        assert woken == []
        await clock.advance(0.1)
        assert woken == ["j"] and alarms.rearmed == 0

    asyncio.run(scenario())


def test_a_verdict_that_changed_while_the_decision_was_written_wakes_the_job_at_once():
    job = Job(FakeClock(), state="Uncertain", in_seconds=60)
    alarms, woken = alarms_for(job)
    alarms.arm("j", {"p1": "Healthy"})  # decided on Healthy; Uncertain by the time it is armed
    assert woken == ["j"]
    assert len(alarms) == 0


def test_no_deadline_sets_no_alarm_and_a_cancelled_alarm_never_rings():
    async def scenario():
        clock = FakeClock()
        job = Job(clock, in_seconds=None)  # a pod not running yet, or heartbeats not required
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})
        assert len(alarms) == 0 and woken == []
        job.deadline = clock.now + 2
        alarms.arm("j", {"p1": "Healthy"})
        alarms.cancel("j")  # the job is gone
        await clock.advance(10)  # past the deadline: nothing may ring
        assert woken == [] and len(alarms) == 0

    asyncio.run(scenario())


def test_arming_again_replaces_the_alarm():
    async def scenario():
        clock = FakeClock()
        job = Job(clock, in_seconds=3)
        alarms, woken = alarms_for(job)
        alarms.arm("j", {"p1": "Healthy"})
        job.deadline = clock.now + 60
        alarms.arm("j", {"p1": "Healthy"})  # a later decision, after a beat
        await clock.advance(10)
        assert woken == [] and alarms.rearmed == 0, "the first alarm was replaced, not kept"
        assert len(alarms) == 1

    asyncio.run(scenario())
